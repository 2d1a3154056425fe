"""What contains code under test in this executor, as ``GET /health`` reports it.

Each guarantee says what enforces it (a cgroup, a tmpfs, an rlimit, or nothing) and every one
that is missing says why, so an operator reading ``/health`` sees the sandbox as it is, not as
it was meant to be.
"""

from __future__ import annotations

from sandbox_client.protocol import SandboxLimit, SandboxReport
from task_executor.sandbox import confined, seccomp
from task_executor.sandbox.capabilities import Capabilities
from task_executor.sandbox.limits import Limits


def sandbox_report(
    caps: Capabilities,
    limits: Limits,
    controllers: frozenset[str],
    runtime_directories: list[str],
    mode: str,
    cpu_weight: int | None = None,
    root: str = "host",
) -> SandboxReport:
    """The report for a factory in ``mode`` with these capabilities, limits, cgroup controllers
    and copy-on-write runtime directories."""
    quota = caps.tmpfs_quota and limits.disk_bytes is not None
    writable = ["workspace tree", "/tmp", "$HOME (in /tmp)"]
    writable += runtime_directories
    if not caps.sandbox:
        writable = ["everything the executor's uid may write (no sandbox)"]
    return SandboxReport(
        tool="bwrap" if caps.sandbox else "none",
        tool_source=caps.bwrap_source,  # type: ignore[arg-type]
        denied_syscalls=list(seccomp.DENIED) if caps.sandbox and "seccomp" not in caps.missing
        else [],
        user_namespace=caps.sandbox,
        sandbox_uid=caps.sandbox_uid,
        pid_namespace=caps.sandbox,
        mount_namespace=caps.sandbox,
        read_only_host=caps.sandbox,
        root="image" if root == "image" else "host",
        executor_hidden=caps.sandbox,
        copy_on_write=writable if mode == "overlay" or not caps.sandbox
        else [w for w in writable if w != "workspace tree"] + ["workspace tree (a copy)"],
        limits={
            "processes": SandboxLimit(
                limit=limits.pids,
                enforced_by="cgroup" if "pids" in controllers
                else ("rlimit-per-uid" if limits.pids is not None else None),
            ),
            "memory": SandboxLimit(
                limit=limits.memory_bytes if "memory" in controllers else None,
                enforced_by="cgroup" if "memory" in controllers else None,
            ),
            "disk": SandboxLimit(
                limit=limits.disk_bytes if quota else None,
                enforced_by="tmpfs" if quota else None,
            ),
            "file_size": SandboxLimit(
                limit=limits.fsize_bytes,
                enforced_by="rlimit" if limits.fsize_bytes is not None else None,
            ),
            "processes_all_workspaces": SandboxLimit(
                limit=limits.all_pids if "pids" in controllers else None,
                enforced_by="cgroup" if "pids" in controllers and limits.all_pids else None,
            ),
            "memory_all_workspaces": SandboxLimit(
                limit=limits.all_memory_bytes if "memory" in controllers else None,
                enforced_by="cgroup" if "memory" in controllers and limits.all_memory_bytes
                else None,
            ),
            "shm": SandboxLimit(
                limit=limits.shm_bytes if caps.sandbox else None,
                enforced_by="tmpfs" if caps.sandbox else None,
            ),
            # Not a cap: the same weight for every workspace, so each gets a fair share.
            "cpu_weight": SandboxLimit(
                limit=cpu_weight, enforced_by="cgroup" if cpu_weight is not None else None,
            ),
        },
        file_access=confined.MODE,
        executor_mount_namespace="private" if caps.private_mount_namespace else "host",
        missing=dict(caps.missing),
    )
