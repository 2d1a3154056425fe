"""Who is on the other end of a loopback connection: refusing code under test that shares the
host's network.

A sandbox that runs with egress allowed shares the host's network namespace, and with it the
executor's port on 127.0.0.1; without a token (a local executor) it could drive every other
session. Its sockets belong to the sandbox uid, and the kernel says so: ``/proc/net/tcp`` lists
every TCP socket of this network namespace with its owner. So a request whose peer socket is the
sandbox uid's is refused, whatever it claims; a connection from anywhere else is unaffected.

The peer socket is the one whose local end is the peer's address and port *and* whose remote end
is this connection's own port: the kernel gives one ephemeral port to several connections with
different destinations, so matching the peer's end alone found, under load, a root process's
socket to another server first and let the sandbox's request through. Every socket that matches
counts (one of the sandbox uid's refuses), and a peer that cannot be found at all is refused too:
a live connection is always in the table, so not finding it is never a reason to trust it.
"""

from __future__ import annotations

import ipaddress
import socket

NOT_FOUND = -1
"""``socket_owners`` found no socket for the connection."""


def _hex_address(address: str, port: int, family: int) -> str:
    """An address column of /proc/net/tcp (AF_INET) or tcp6 (AF_INET6) for ``address:port``."""
    packed = socket.inet_pton(family, address)
    # Each 32-bit word is printed in host (little-endian) order.
    words = [packed[i:i + 4][::-1].hex().upper() for i in range(0, len(packed), 4)]
    return f"{''.join(words)}:{port:04X}"


def _spellings(address: str) -> list[tuple[str, int]]:
    """(table, column text without the port) pairs an address can appear as: an IPv4 peer
    of a dual-stack listener arrives as ``::ffff:a.b.c.d`` while its own socket may be IPv4."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return [("/proc/net/tcp6", socket.AF_INET6), ("/proc/net/tcp", socket.AF_INET)]
    if ip.version == 6:
        return [("/proc/net/tcp6", socket.AF_INET6)]
    return [("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)]


def _as(address: str, family: int) -> str:
    """``address`` spelt for ``family`` (IPv4 as mapped IPv6 and back)."""
    ip = ipaddress.ip_address(address)
    if family == socket.AF_INET:
        return str(ip.ipv4_mapped) if ip.version == 6 and ip.ipv4_mapped else str(ip)
    return str(ip) if ip.version == 6 else f"::ffff:{ip}"


def socket_owners(peer_address: str, peer_port: int, our_port: int) -> set[int]:
    """The uids owning the TCP sockets whose local end is ``peer_address:peer_port`` and whose
    remote end is our ``our_port``, in this network namespace; ``{NOT_FOUND}`` when none is."""
    owners: set[int] = set()
    for table, family in _spellings(peer_address):
        try:
            local = _hex_address(_as(peer_address, family), peer_port, family)
        except (OSError, ValueError):
            continue
        remote_port = f":{our_port:04X}"
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 7 and fields[1] == local and fields[2].endswith(remote_port):
                        owners.add(int(fields[7]))
        except OSError:
            continue
    return owners or {NOT_FOUND}


def is_loopback(address: str) -> bool:
    """Loopback, an IPv4-mapped loopback (``::ffff:127.0.0.1``) included."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
