"""What the kernel lets us do, detected once at start, and the launcher that uses it.

Fast mode needs three things: overlay mounts in the base directory (copy-on-write workspaces),
private mount namespaces (each task sees its own tree at the same fixed path) and network
namespaces (a loopback-only network for code under test). A default Kubernetes pod allows none of
them; then the executor falls back (plain copies, no fixed path, no egress guard) and says so in
``/health``. Nothing here guesses: each capability is tried for real.

The launcher is an argv prefix: ``unshare`` makes the namespaces, a tiny ``sh`` script binds the
workspace at the fixed path and a private /tmp, brings loopback up, applies resource limits,
optionally drops to an unprivileged uid, then ``exec``s the real command.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """Kernel features available to this executor (see the module docstring)."""

    overlay: bool
    mount_namespace: bool
    network_namespace: bool
    reflink: bool


def _quiet(argv: list[str], timeout: float = 10) -> bool:
    try:
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout
        ).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _can_overlay(scratch: Path) -> bool:
    layers = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    for path in layers.values():
        path.mkdir()
    (layers["lower"] / "probe").write_text("lower")
    options = f"lowerdir={layers['lower']},upperdir={layers['upper']},workdir={layers['work']}"
    if not _quiet(["mount", "-t", "overlay", "overlay", "-o", options, str(layers["merged"])]):
        return False
    try:
        (layers["merged"] / "probe").write_text("upper")
        return (layers["lower"] / "probe").read_text() == "lower"
    finally:
        _quiet(["umount", str(layers["merged"])])


def _can_reflink(scratch: Path) -> bool:
    source = scratch / "reflink-source"
    source.write_bytes(b"x" * 4096)
    return _quiet(["cp", "--reflink=always", str(source), str(scratch / "reflink-copy")])


def detect(base_dir: Path) -> Capabilities:
    """Try each feature for real inside ``base_dir`` (where workspaces will live)."""
    base_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".probe-", dir=base_dir) as scratch:
        overlay = shutil.which("mount") is not None and _can_overlay(Path(scratch))
        reflink = _can_reflink(Path(scratch))
    mount_ns = shutil.which("unshare") is not None and _quiet(
        ["unshare", "--mount", "--propagation", "private", "true"]
    )
    net_ns = (
        mount_ns
        and shutil.which("ip") is not None
        and _quiet(["unshare", "--net", "sh", "-c", "ip link set lo up"])
    )
    found = Capabilities(
        overlay=overlay, mount_namespace=mount_ns, network_namespace=net_ns, reflink=reflink
    )
    log.info("isolation capabilities: %s", found)
    return found


# The script run between unshare and the command. Arguments: tree, fixed path, private tmp and
# where to show it (/tmp itself, or a fixed directory when /tmp must stay shared), a directory to
# hide (the executor's base directory: other tasks' trees, mirrors, templates, logs),
# the bring-loopback-up flag, then the command. Mount failures abort: a task must never run in the
# host's view of the fixed path or with the host's /tmp.
_INSIDE = r"""
set -e
tree=$1 fixed=$2 tmp=$3 tmpdir=$4 hide=$5 loopback=$6
shift 6
if [ -n "$fixed" ]; then mount --bind "$tree" "$fixed"; cd "$fixed"; else cd "$tree"; fi
if [ -n "$tmp" ]; then mount --bind "$tmp" "$tmpdir"; fi
if [ -n "$hide" ] && [ -d "$hide" ]; then mount -t tmpfs -o size=64k,mode=0555 none "$hide"; fi
if [ "$loopback" = 1 ]; then ip link set lo up; fi
exec "$@"
"""


@functools.cache
def _have_prlimit() -> bool:
    """Looked up once: every grading and session start builds a launcher."""
    return shutil.which("prlimit") is not None


@dataclass(frozen=True)
class Limits:
    """Resource limits of code under test (prlimit names; None leaves a limit as it is)."""

    nproc: int | None = 4096
    fsize_bytes: int | None = 8 * 1024**3

    def prlimit_argv(self) -> list[str]:
        if not _have_prlimit():
            return []
        pairs = [("--nproc", self.nproc), ("--fsize", self.fsize_bytes)]
        options = [f"{flag}={value}" for flag, value in pairs if value is not None]
        return ["prlimit", *options, "--"] if options else []


@dataclass(frozen=True)
class Sandbox:
    """How to launch code under test for one workspace."""

    capabilities: Capabilities
    fixed_path: str | None
    hide: str | None = None
    private_tmp: bool = True
    """Bind each workspace's own directory over /tmp (off when the executor's interpreter, the
    reporter or a PATH entry lives under /tmp: code under test could not reach them)."""
    limits: Limits = Limits()
    run_as: tuple[int, int] | None = None

    def launcher(self, tree: Path, tmp: Path | None, deny_network: bool) -> list[str]:
        """The argv prefix that runs a command inside this workspace's sandbox."""
        if deny_network and not self.capabilities.network_namespace:
            # Fail closed: callers check `can_deny_network` first; this is the last guard.
            raise RuntimeError("egress denial requested but network namespaces are unavailable")
        tail = self.limits.prlimit_argv()
        if self.run_as is not None:
            uid, gid = self.run_as
            tail = [*tail, "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        if not self.capabilities.mount_namespace:
            return tail
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if deny_network:
            unshare.append("--net")
        fixed = self.fixed_path or ""
        return [
            *unshare, "--", "sh", "-c", _INSIDE, "dockyard-sandbox",
            str(tree), fixed, str(tmp) if tmp else "", self.visible_tmp(tmp or Path("/tmp")),
            self.hide or "", "1" if deny_network else "0", *tail,
        ]

    @property
    def can_deny_network(self) -> bool:
        return self.capabilities.network_namespace

    def visible_tmp(self, tmp: Path) -> str:
        """Where code under test sees its private temporary directory (TMPDIR)."""
        if not self.capabilities.mount_namespace:
            return str(tmp)
        if self.private_tmp:
            return "/tmp"
        # The real directory is inside the hidden base directory: show it at a fixed place.
        return f"{self.fixed_path or '/dockyard'}.tmp"


def needed_under_tmp(paths: list[str]) -> list[str]:
    """Which of ``paths`` a private /tmp would hide from code under test."""
    tmp = os.path.realpath("/tmp")
    return [p for p in paths if p and os.path.realpath(p).startswith(tmp + os.sep)]


def prepare_fixed_path(fixed_path: str | None, capabilities: Capabilities) -> str | None:
    """Create the fixed mount points (empty directories on the host: the tree's, and its
    temporary directory's for when /tmp stays shared) when they can be used."""
    if not fixed_path or not capabilities.mount_namespace:
        return None
    os.makedirs(fixed_path, exist_ok=True)
    os.makedirs(f"{fixed_path}.tmp", exist_ok=True)
    return fixed_path
