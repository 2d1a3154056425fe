"""The launcher: how every process of code under test is started and contained.

Code under test (tests, setup, session shells and all they start) is hostile and runs as root
inside its sandbox by default, so the sandbox has to make that root worthless outside. Where
bubblewrap works (``capabilities.detect``), a command runs as::

    sh -c <join the workspace's cgroups>    pids and memory limits, joined before anything else;
                                            RLIMIT_FSIZE (``ulimit -f``)
    setpriv --reuid=U ... --no-new-privs    the sandbox uid, no capabilities, none to regain
    (prlimit --nproc)                       only without a pids cgroup
    bwrap --unshare-user --uid 0 ...        root inside = U outside, holding no capability over
                                            anything outside; new PID namespace and /proc, new
                                            mount, IPC, UTS (and, to deny egress, network)
                                            namespaces; nested user namespaces refused; killed
                                            with its parent; its own session (no TIOCSTI)

and sees: the host root read-only; a private minimal /dev, a size-limited /dev/shm, /run empty;
the executor's base directory, interpreter, venv and code hidden under empty tmpfs; the workspace
read-write at the fixed path, its own /tmp (and home in it, also shown at /root when root
inside); the copy-on-write runtime
directories the workspace factory mounted; the reporter plugin read-only at ``REPORTER_MOUNT``.

Without bubblewrap there is no sandbox: commands run as the executor's uid (or ``run_as``) with
rlimits only, in ``git-clone`` mode, and ``/health`` says so.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .capabilities import Capabilities, drop_to, searchable_by_others
from .cgroups import SANDBOX_MEMORY_FILES, Group
from .limits import Limits
from .namespaces import Launcher, MountNamespace
from .programs import host_program

REPORTER_MOUNT = "/run/dockyard/reporter"
"""Where code under test finds the reporter plugin (read-only; the executor's own packages are
never on its ``sys.path``)."""
MALLOC_TUNABLE = "glibc.malloc.mmap_threshold=65536"
"""What bubblewrap runs with (see ``_WRAPPER``), never code under test."""
ROOT_HOME = "/root"
"""Where the sandbox's root finds its home: the workspace's private home directory."""
REPO_MOUNT = "/run/dockyard/repo"
"""Where git run inside the sandbox finds the repository mirror (read-only)."""


@dataclass(frozen=True)
class Bind:
    """A host directory shown to code under test at ``target``."""

    source: Path
    target: str
    writable: bool = True


@dataclass(frozen=True)
class Sandbox:
    """How to launch code under test for one workspace."""

    capabilities: Capabilities
    fixed_path: str | None
    hide: tuple[str, ...] = ()
    """Host directories replaced by an empty tmpfs (base dir, executor interpreter, venv, code)."""
    limits: Limits = Limits()
    run_as: tuple[int, int] | None = None
    """uid/gid code under test runs as (inside the sandbox: it maps to the sandbox uid)."""
    reporter_dir: Path | None = None
    runtime_dirs: tuple[str, ...] = field(default_factory=tuple)
    """Host directories every workspace sees copy-on-write (the workspace factory mounts them)."""
    host_view: tuple[str, ...] = ("--ro-bind", "/", "/")
    """bwrap arguments that show the host read-only (see ``hostview``)."""
    seccomp_filter: Path | None = None
    """The compiled filter bubblewrap installs (see ``seccomp``; root-only, opened by the
    wrapper), or None where there is none for this machine."""
    root: str = "host"
    """Whose root ``host_view`` shows: ``host``, or ``image`` (a task image's unpacked root)."""
    cgroup_tree: bool = True
    """The view shows a cgroup tree at ``/sys/fs/cgroup`` (the host's does; an unpacked image's
    ``/sys`` is empty), which every sandbox then sees only its own groups of."""

    @property
    def active(self) -> bool:
        return self.capabilities.sandbox

    has_root_home: bool = True
    """The root shown has a ``/root`` to mount the workspace's home on (the host's does; a task
    image usually does, as SWE-bench's do; an image without one keeps its home at /tmp/home)."""
    home_is_layer: bool = False
    """``/root`` is a copy-on-write runtime layer (a task image's own home, see ``services``):
    the workspace's empty home is not mounted over it."""

    @property
    def root_home(self) -> str | None:
        """Where code under test running as root inside finds the workspace's home (also
        /tmp/home): writable, gone with the workspace, the host's or the image's /root never
        shown (SWE-agent installs tools under /root/tools). None without a sandbox, for another
        user, or over a root with no /root to mount on."""
        if not self.active or self.run_as is not None or not self.has_root_home:
            return None
        return ROOT_HOME

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who files code under test may edit must belong to on the host (None: leave as is)."""
        if self.active:
            uid = self.capabilities.sandbox_uid
            assert uid is not None
            return (uid, uid) if os.geteuid() == 0 else None
        return self.run_as

    def launcher(
        self,
        tree: Path,
        tmp: Path | None,
        deny_network: bool,
        *,
        group: Group | None = None,
        binds: tuple[Bind, ...] = (),
        args_dir: Path | None = None,
        namespace: MountNamespace | None = None,
        chdir: str | None = None,
    ) -> Launcher:
        """How to run a command inside this workspace's sandbox: an argv prefix, started from
        the workspace's launch ``namespace`` (see ``namespaces``) where there is one.

        With ``args_dir`` (a directory only the executor can read), bubblewrap's options go to
        a file there, handed over on fd 3 (``bwrap --args 3``): the sandbox's pid 1 is bwrap,
        whose argv every process inside can read, and the options name host paths.

        Commands start in the tree (at the fixed path) unless ``chdir`` names another directory
        inside: bwrap exits 1 when it cannot enter it, before anything runs, and a tree's root
        is its code's to chmod.
        """
        if deny_network and not self.capabilities.network_namespace:
            # Fail closed: callers check `can_deny_network` first; this is the last guard.
            raise RuntimeError("egress denial requested but network namespaces are unavailable")
        nproc = group is None or "pids" not in group.directories
        cgroup_files = group.procs_files if group is not None else []
        if not self.active:
            tail = self.limits.prlimit_argv(nproc=nproc)
            if self.run_as is not None:
                uid, gid = self.run_as
                tail = [*tail, host_program("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}",
                        f"--regid={gid}", "--clear-groups", "--no-new-privs", "--"]
            argv = [*_wrapper(cgroup_files, None, None, None), *tail] if cgroup_files else tail
            return Launcher(tuple(argv), namespace)
        # The file size limit is the wrapper's own `ulimit -f`: one exec (prlimit's) fewer on
        # every start, about a millisecond.
        rlimits = self.limits.prlimit_argv(nproc=nproc, fsize=False)
        fsize = self.limits.fsize_blocks
        uid = self.capabilities.sandbox_uid
        assert uid is not None and self.capabilities.bwrap is not None
        options = self._bwrap_options(tree, tmp, deny_network, binds, chdir, group)
        seccomp = self.seccomp_filter
        if args_dir is None:
            argv = [*_wrapper(cgroup_files, None, seccomp, fsize), *drop_to(uid), *rlimits,
                    self.capabilities.bwrap, *options, "--"]
        else:
            args_files = (_write_args(args_dir, options),
                          _write_args(args_dir, [*options, "--unsetenv", "GLIBC_TUNABLES"]))
            argv = [*_wrapper(cgroup_files, args_files, seccomp, fsize), *drop_to(uid),
                    *rlimits, self.capabilities.bwrap, "--args", "3", "--"]
        return Launcher(tuple(argv), namespace, confined=True)  # bwrap's --unshare-pid

    def _bwrap_options(
        self, tree: Path, tmp: Path | None, deny_network: bool, binds: tuple[Bind, ...],
        chdir: str | None = None, group: Group | None = None,
    ) -> list[str]:
        inside_uid, inside_gid = self.run_as or (0, 0)
        fixed = self.fixed_path or "/testbed"
        argv = [
            "--unshare-user", "--uid", str(inside_uid), "--gid", str(inside_gid),
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--disable-userns", *(["--unshare-net"] if deny_network else []),
            "--die-with-parent", "--new-session",
            *self.host_view, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run",
        ]
        argv += ["--size", str(self.limits.shm_bytes), "--tmpfs", "/dev/shm"]
        # The cgroup tree names every workspace's group and shows its usage: a sandbox sees its
        # own groups only, read-only, where a tool reading its limits looks for them.
        if self.cgroup_tree:
            argv += ["--tmpfs", CGROUP_ROOT]
            for source, target in own_cgroup_binds(group):
                argv += ["--ro-bind", source, target]
            argv += ["--remount-ro", CGROUP_ROOT]
        if tmp is not None:
            argv += ["--bind", str(tmp), "/tmp"]
            if self.root_home is not None and not self.home_is_layer:
                argv += ["--bind", str(tmp / "home"), self.root_home]
        argv += ["--bind", str(tree), fixed]
        for bind in binds:
            argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), bind.target]
        # Last, so that a copy-on-write runtime directory (/opt) bound above does not show the
        # executor's venv inside it again.
        for hidden in self.hide:
            argv += ["--tmpfs", hidden]
        if self.reporter_dir is not None:
            argv += ["--ro-bind", str(self.reporter_dir), REPORTER_MOUNT]
        if self.host_view[:2] == ("--tmpfs", "/"):
            argv += ["--remount-ro", "/"]  # after every mount point was made in it
        if self.seccomp_filter is not None:
            argv += ["--seccomp", str(SECCOMP_FD)]  # the wrapper opened the filter there
        return [*argv, "--chdir", chdir or fixed, "--hostname", "dockyard"]

    @property
    def can_deny_network(self) -> bool:
        return self.capabilities.network_namespace

    def visible_tmp(self, tmp: Path) -> str:
        """Where code under test sees its private temporary directory (TMPDIR)."""
        return "/tmp" if self.active else str(tmp)

    def visible_reporter(self) -> str | None:
        if self.reporter_dir is None:
            return None
        return REPORTER_MOUNT if self.active else str(self.reporter_dir)


# The first thing a sandboxed command runs, as root: its own pid into each of its cgroups (a
# failure aborts, 125: a command must never run outside its limits), its file size limit (POSIX
# `ulimit -f`, soft and hard, in 512-byte blocks), the bubblewrap options file
# opened on fd 3 (root-only; bwrap reads and closes it), the host's PWD forgotten (bwrap's
# environment is readable inside), then the rest: setpriv, prlimit, bwrap.
#
# And a malloc setting for bubblewrap: it indexes the mount table by mount id (ids are global: a
# machine with 1,000 live sessions has ids past 100,000) in an array of 8 bytes an id, once per
# mount it makes; glibc serves the second and later ones from the heap and keeps it, so each
# sandbox's init process held ~0.5 MB it never used again. A fixed mmap threshold hands such
# arrays back on free. bwrap then drops the variable (the second options file says
# ``--unsetenv``), so code under test never sees it; a task that sets its own keeps it, and the
# first options file (without the unset) is used.
#
# And the seccomp filter (see ``seccomp``), opened on fd 4 for bubblewrap's ``--seccomp 4``.
SECCOMP_FD = 4
_WRAPPER = (
    'a=$1; b=$2; s=$3; f=$4; n=$5; shift 5; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; '
    'if [ -n "$f" ]; then ulimit -f "$f" || exit 125; fi; '
    'if [ -n "$s" ]; then exec 4< "$s" || exit 125; fi; '
    'if [ -n "$a" ]; then if [ -n "${GLIBC_TUNABLES+x}" ]; then '
    'exec 3< "$a" || exit 125; else export GLIBC_TUNABLES=' + MALLOC_TUNABLE + '; '
    'exec 3< "$b" || exit 125; fi; fi; unset PWD OLDPWD; exec "$@"'
)


CGROUP_ROOT = "/sys/fs/cgroup"


def own_cgroup_binds(group: Group | None) -> list[tuple[str, str]]:
    """(host path, where the sandbox sees it) for each of a workspace's groups: a v1
    controller's at ``/sys/fs/cgroup/<controller>``, the v2 group at ``/sys/fs/cgroup``. Of a v1
    memory group, handed on from workspace to workspace, only its limit (see
    ``cgroups.SANDBOX_MEMORY_FILES``): its other files count what the last workspaces did."""
    if group is None:
        return []
    binds = []
    for controller, directory in sorted(group.directories.items()):
        # <root>/<controller>/dockyard-<id>/<name> under v1, <root>/dockyard-<id>/<name> under v2
        v2 = directory.parent.parent == Path(CGROUP_ROOT)
        target = CGROUP_ROOT if v2 else f"{CGROUP_ROOT}/{controller}"
        if controller == "memory" and not v2:
            binds += [(str(directory / name), f"{target}/{name}") for name in SANDBOX_MEMORY_FILES]
        else:
            binds.append((str(directory), target))
    return list(dict.fromkeys(binds))


def _wrapper(cgroup_files: list[str], args_files: tuple[Path, Path] | None,
             seccomp: Path | None, fsize_blocks: int | None) -> list[str]:
    own, unsetting = args_files or ("", "")
    return [host_program("sh") or "/bin/sh", "-c", _WRAPPER, "dockyard-sandbox",
            str(own), str(unsetting), str(seccomp or ""),
            "" if fsize_blocks is None else str(fsize_blocks), str(len(cgroup_files)),
            *cgroup_files]


def _write_args(directory: Path, options: list[str]) -> Path:
    """The options as a NUL-separated file in ``directory`` (one per distinct set, kept)."""
    data = b"".join(os.fsencode(option) + b"\0" for option in options)
    target = directory / f".bwrap-{hashlib.sha256(data).hexdigest()[:20]}"
    if not target.exists():
        temporary = directory / f".bwrap-{uuid.uuid4().hex}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target)
    return target


def prepare_fixed_path(fixed_path: str | None, capabilities: Capabilities) -> str | None:
    """The fixed path code under test sees its tree at, when there is a sandbox to show it (the
    sandbox's root is its own tmpfs: nothing is created on the host)."""
    if not fixed_path or not capabilities.sandbox:
        return None
    return fixed_path


def hidden_paths(base_dir: Path, extra: list[str]) -> tuple[str, ...]:
    """What code under test must not see: the base directory, and ``extra`` (the executor's own
    interpreter, venv and code, and ``DOCKYARD_HIDE_PATHS``), except system prefixes that the
    task's runtime shares."""
    shared = {"/", "/usr", "/usr/local", "/bin", "/lib", "/opt", "/etc", "/var", "/home"}
    found = []
    for path in [str(base_dir), *extra]:
        real = os.path.realpath(path)
        if not real or real in shared or real.startswith("/tmp/") or real == "/tmp":
            continue  # /tmp is private in every sandbox already
        # A directory a stranger cannot reach is out of sight already (root inside the sandbox
        # holds no capability to pass a mode it lacks); bwrap could not mount over it either.
        if os.path.isdir(real) and real not in found and not searchable_by_others(Path(real)):
            found.append(real)
    # A parent hidden makes its children's tmpfs unnecessary (and its mount point vanish).
    return tuple(p for p in found if not any(p.startswith(q + "/") for q in found if q != p))
