"""The conditions tests run under, as this executor gives them, and refusing what it cannot give.

Denied egress and the uid alone flipped up to 4.9% of labels on SWE-Gym tasks (Sandman's condition
probe), so every result says what its tests ran under, and a task may declare what it needs.

Fixed by the executor and known to it: the CPU quota (its own cgroup's), the CPU weight (each
workspace's CPU cgroup has the same one: ``cpu_weight``), the memory limit (the workspace's memory
cgroup, else the executor's own), egress (the network namespace a grading asks for) and the
workspace mode. Measured inside the sandbox, where they can differ from the executor's view: the
CPUs visible, uid and gid as code under test sees them, the size of its private ``/dev/shm``, its
time zone and the version of ``python`` on its ``PATH``. The probe runs once per template
(repository, commit, setup, environment), in the first workspace of that template a grading or
session makes, before any agent patch is in it, and is kept: later gradings pay nothing. Until a
template was probed, its inside fields are the executor's expectation (its own affinity, the
configured uid and ``/dev/shm`` size, its time zone), so a requirement is refused before any work
wherever it can be, and right after the probe else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from sandbox_client.protocol import RequiredConditions, RunConditions
from task_executor.errors import Conflict
from task_executor.sandbox.command import run_command
from task_executor.sandbox.host_budget import own_cgroup, own_memory_limit, read_value
from task_executor.workspaces.workspace import Workspace, WorkspaceFactory

from .once import OnceCache

log = logging.getLogger(__name__)

_PROBE = r"""
import json, os, sys, time
try:
    cpus = len(os.sched_getaffinity(0))
except Exception:
    cpus = None
def zone():
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        return name
    try:
        target = os.readlink("/etc/localtime")
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    except OSError:
        pass
    return time.tzname[0]
try:
    shm = os.statvfs("/dev/shm")
    shm = shm.f_blocks * shm.f_frsize
except Exception:
    shm = None
print("DOCKYARD-CONDITIONS " + json.dumps({"cpus": cpus, "uid": os.getuid(), "gid": os.getgid(),
      "shm_bytes": shm, "timezone": zone(), "python": "%d.%d.%d" % tuple(sys.version_info[:3])}))
"""
_RUN_PROBE = ('for p in python python3; do if command -v "$p" >/dev/null 2>&1; then '
              'exec "$p" -S -c "$DOCKYARD_PROBE"; fi; done; exit 127')
_MARK = "DOCKYARD-CONDITIONS "
_INSIDE = ("cpus", "uid", "gid", "shm_bytes", "timezone", "python")
_AT_LEAST = ("cpus", "cpu_quota", "memory_limit_bytes", "shm_bytes")
_UNLIMITED_WHEN_NONE = ("cpu_quota", "memory_limit_bytes")
_UNLIMITED = 1 << 60


class ProbeFailed(Exception):
    """The probe gave no answer this time (kept nothing: the next workspace probes again)."""


class ConditionsMismatch(Conflict):
    """409: this executor cannot give the conditions a task declared (another one may)."""

    code = "conditions_mismatch"


def mismatches(required: RequiredConditions, have: RunConditions, measured: bool) -> list[str]:
    """One line per declared field ``have`` does not meet. No memory limit or CPU quota meets any
    minimum; any other field that is None is unknown: not judged before the probe (``measured``
    false), a mismatch after it."""
    found = []
    for name, wanted in required.model_dump(exclude_none=True).items():
        value = getattr(have, name)
        if value is None:
            if measured and name not in _UNLIMITED_WHEN_NONE:
                found.append(f"{name}: required {wanted!r}, not measurable here")
        elif name in _AT_LEAST:
            if value < wanted:
                found.append(f"{name}: required at least {wanted}, here {value}")
        elif name == "python":
            if not (value == wanted or value.startswith(f"{wanted}.")):
                found.append(f"python: required {wanted}, here {value}")
        elif value != wanted:
            found.append(f"{name}: required {wanted!r}, here {value!r}")
    return found


def check(required: RequiredConditions | None, have: RunConditions, measured: bool) -> None:
    """Raise ConditionsMismatch naming every field of ``required`` that ``have`` does not meet."""
    if required is None:
        return
    found = mismatches(required, have, measured)
    if found:
        raise ConditionsMismatch("this executor cannot give the declared conditions: "
                                 + "; ".join(found))


class ConditionProbe:
    """What tests run under here, probed once per template key and kept."""

    def __init__(self, workspaces: WorkspaceFactory, memory_limit_bytes: int | None,
                 run_as: tuple[int, int] | None, shm_bytes: int) -> None:
        self.workspaces = workspaces
        self.memory_limit_bytes = memory_limit_bytes
        self.run_as = run_as
        self.shm_bytes = shm_bytes
        self._measured: OnceCache[dict[str, object]] = OnceCache(max_entries=4096)

    def expected(self, key: str, env: dict[str, str], deny_network: bool) -> RunConditions:
        """The conditions a workspace of template ``key`` would get, before making one."""
        sandboxed = self.workspaces.sandbox.active
        controllers = self.workspaces.groups.controllers if self.workspaces.groups else ()
        memory = self.memory_limit_bytes if "memory" in controllers else None
        uid, gid = self.run_as or ((0, 0) if sandboxed else (os.getuid(), os.getgid()))
        conditions = RunConditions(
            cpus=len(os.sched_getaffinity(0)),
            cpu_quota=cpu_quota(),
            cpu_weight=self.workspaces.groups.cpu_weight if self.workspaces.groups else None,
            memory_limit_bytes=min_limit(memory, own_memory_limit()),
            uid=uid,
            gid=gid,
            egress=not deny_network,
            shm_bytes=self.shm_bytes if sandboxed else _shm_size(),
            timezone=env.get("TZ", "").lstrip(":") or _zone(),
            python=None,
            workspace_mode=self.workspaces.mode,
        )
        measured = self._measured.peek(key)
        return conditions.model_copy(update=measured) if measured else conditions

    def measure(self, key: str, workspace: Workspace, env: dict[str, str],
                deny_network: bool) -> RunConditions:
        """The conditions in ``workspace`` (of template ``key``), probing it first if no
        workspace of that template was probed yet (concurrent gradings of a template wait for
        one probe). Run before any agent patch is applied."""
        try:
            self._measured.get(key, lambda: self._probe(workspace, env, deny_network))
        except (ProbeFailed, RuntimeError) as exc:
            log.warning("conditions probe: %s", exc)
        return self.expected(key, env, deny_network)

    def _probe(self, workspace: Workspace, env: dict[str, str],
               deny_network: bool) -> dict[str, object]:
        """What the probe measured (nothing but the interpreter's absence, when there is no
        python); ProbeFailed when it gave no answer otherwise."""
        started = time.monotonic()
        outcome = run_command(
            _RUN_PROBE, cwd=str(workspace.path),
            env={**workspace.sandbox_env(env), "DOCKYARD_PROBE": _PROBE}, timeout=60,
            launcher=workspace.launcher(deny_network),
        )
        found: dict[str, object] = {}
        for line in reversed(outcome.output.splitlines()):
            if line.startswith(_MARK):
                with contextlib.suppress(ValueError, AttributeError):
                    data = json.loads(line[len(_MARK):])
                    found = {k: data[k] for k in _INSIDE if data.get(k) is not None}
                break
        log.info("conditions probed in %.3fs: %s", time.monotonic() - started, found)
        if found or outcome.exit_code == 127:
            return found  # no interpreter at all is an answer (the executor's view stands)
        raise ProbeFailed(f"no answer (exit {outcome.exit_code}): {outcome.output[-300:]}")


def min_limit(*limits: int | None) -> int | None:
    present = [limit for limit in limits if limit is not None]
    return min(present) if present else None


def cpu_quota() -> float | None:
    """CPUs' worth of time this executor's cgroup may use (None: no quota)."""
    group = own_cgroup("cpu")
    if group is None:
        return None
    cpu_max = read_value(group / "cpu.max")
    if cpu_max is not None:
        quota, _, period = cpu_max.partition(" ")
        return None if quota == "max" else round(int(quota) / int(period or 100000), 3)
    quota, period = read_value(group / "cpu.cfs_quota_us"), read_value(group / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) < 0:
        return None
    return round(int(quota) / int(period), 3)


def _shm_size() -> int | None:
    try:
        info = os.statvfs("/dev/shm")
    except OSError:
        return None
    return info.f_blocks * info.f_frsize


def _zone() -> str:
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return time.tzname[0]
    return target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else time.tzname[0]
