"""A seccomp filter for code under test: no kernel keyrings.

Keyrings are not namespaced: every sandbox runs as one uid outside, so a key one session adds
(with a description it chose) shows in every other session's ``/proc/keys`` -- a covert channel
between tenants, and nothing a test needs. Docker's default profile denies the same three calls.
The filter makes ``add_key``, ``request_key`` and ``keyctl`` fail with EPERM and lets everything
else through; bubblewrap installs it (``--seccomp FD``) just before it runs the command, so it
binds everything inside, root included, and cannot be removed.

It is a classic BPF program (what bubblewrap takes), assembled here: the three calls by number
for the machine's native architecture and for the 32-bit one it also runs (i386 on x86_64, arm
on aarch64: a hostile agent can bring a 32-bit binary), x32 numbers on x86_64 included. A call
from any other architecture is refused outright.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from pathlib import Path

# seccomp_data: int nr at offset 0, u32 arch at offset 4.
_NR, _ARCH = 0, 4
_LD_ABS_W, _JEQ_K, _AND_K, _RET_K = 0x20, 0x15, 0x54, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# (audit arch, syscall numbers of add_key, request_key, keyctl, clear the x32 bit first)
_ARCHES: dict[str, list[tuple[int, tuple[int, ...], bool]]] = {
    "x86_64": [(0xC000003E, (248, 249, 250), True), (0x40000003, (286, 287, 288), False)],
    "aarch64": [(0xC00000B7, (217, 218, 219), False), (0x40000028, (309, 310, 311), False)],
}
DENIED = ("add_key", "request_key", "keyctl")


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), or None for one it does not know."""
    arches = _ARCHES.get(machine or platform.machine())
    if arches is None:
        return None
    deny = _insn(_RET_K, _ERRNO | errno.EPERM)
    blocks = []
    for _, numbers, x32 in arches:
        # Load the number, (clear the x32 bit), then one test per call: a match jumps to the
        # deny just after the allow that ends the block.
        body = [_insn(_LD_ABS_W, _NR)] + ([_insn(_AND_K, ~_X32_BIT & 0xFFFFFFFF)] if x32 else [])
        for index, number in enumerate(numbers):
            to_deny = len(numbers) - index  # the remaining tests, then the allow
            body.append(_insn(_JEQ_K, number, jt=to_deny, jf=0))
        blocks.append([*body, _insn(_RET_K, _ALLOW), deny])
    # Dispatch on the architecture: test i jumps to its block, past the later tests, the
    # refusal for an unknown architecture and the blocks before it.
    tests = len(arches)
    out = [_insn(_LD_ABS_W, _ARCH)]
    for index, (arch, _, _) in enumerate(arches):
        skip = (tests - index - 1) + 1 + sum(len(block) for block in blocks[:index])
        out.append(_insn(_JEQ_K, arch, jt=skip, jf=0))
    out.append(deny)  # an architecture not listed: nothing runs
    for block in blocks:
        out += block
    return b"".join(out)


def write_filter(path: Path) -> Path | None:
    """The filter for this machine written at ``path`` (root-only: the launcher's wrapper opens
    it as root and hands bubblewrap the fd), or None where there is no filter for it."""
    code = program()
    if code is None:
        return None
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(code)
    os.replace(temporary, path)
    return path
