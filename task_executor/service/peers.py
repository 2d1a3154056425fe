"""Who is on the other end of a loopback connection: refusing code under test that shares the
host's network.

A sandbox that runs with egress allowed shares the host's network namespace, and with it the
executor's port on 127.0.0.1; without a token (a local executor) it could drive every other
session. Its sockets belong to the sandbox uid, and the kernel says so: ``/proc/net/tcp`` lists
every TCP socket of this network namespace with its owner. So a request whose peer socket is the
sandbox uid's is refused, whatever it claims; a connection from anywhere else is unaffected.
"""

from __future__ import annotations

import ipaddress
import socket


def _hex_address(address: str, port: int) -> str:
    """The ``local_address`` column of /proc/net/tcp{,6} for ``address:port``."""
    packed = socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)
    # Each 32-bit word is printed in host (little-endian) order.
    words = [packed[i:i + 4][::-1].hex().upper() for i in range(0, len(packed), 4)]
    return f"{''.join(words)}:{port:04X}"


def socket_owner(address: str, port: int) -> int | None:
    """The uid owning the TCP socket bound to ``address:port`` in this network namespace."""
    wanted = _hex_address(address, port)
    for table in ("/proc/net/tcp6", "/proc/net/tcp") if ":" in address else ("/proc/net/tcp",):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 7 and fields[1] == wanted:
                        return int(fields[7])
        except OSError:
            return None
    return None


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
