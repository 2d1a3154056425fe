"""Tenants learn nothing of each other, and share the CPU fairly.

Two sessions on one executor, as an RL fleet runs them: one hostile, one a neighbour. Before,
``/sys/fs/cgroup`` listed every workspace's group and its memory use, and a key one session added
to the kernel's keyrings (with a description it chose) showed in the other's ``/proc/keys``: a
covert channel. Now each sandbox sees its own cgroups only, and a seccomp filter refuses the
keyring calls. Each workspace also gets a CPU group of one weight, reported in the run conditions
(the fairness itself is measured by ``scripts/bench/bench_fairness.py``, not timed here).
"""

from __future__ import annotations

import errno
import platform
import struct
from pathlib import Path

import pytest

from task_executor.grading.grader import owner_token
from task_executor.sandbox import seccomp
from task_executor.sandbox.cgroups import REUSE_SLACK_BYTES, SANDBOX_MEMORY_FILES
from task_executor.sandbox.cgroups import ROOT as CGROUP_ROOT

ADD_KEY = r'''python3 -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
got = libc.syscall({nr}, b'user', b'{description}', b'x', 1, ctypes.c_int(-4))
print('add_key', got, os.strerror(ctypes.get_errno()))
"'''
NATIVE_ADD_KEY = {"x86_64": 248, "aarch64": 217}


def _sandboxed(executor) -> dict:
    sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
    if sandbox["tool"] != "bwrap":
        pytest.skip(f"no sandbox here: {sandbox['missing']}")
    return sandbox


def _session(executor, demo_task) -> str:
    answer = executor.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit})
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _parents(executor) -> dict[str, Path]:
    """This executor's cgroup parents on the host, by controller (v1 hierarchies here)."""
    name = f"dockyard-{owner_token(executor.settings.base_dir)}"
    return {c: CGROUP_ROOT / c / name for c in ("pids", "memory", "cpu")
            if (CGROUP_ROOT / c / name).is_dir()}


def _run(executor, session: str, command: str) -> str:
    answer = executor.post(f"/session/{session}/exec", json={"command": command})
    assert answer.status_code == 200, answer.text
    return answer.json()["output"]


def test_a_sandbox_sees_its_own_cgroups_and_no_one_elses(executor, demo_task):
    _sandboxed(executor)
    neighbour, own = _session(executor, demo_task), _session(executor, demo_task)
    _run(executor, neighbour, "true")
    parents = _parents(executor)
    if not parents:
        pytest.skip("no cgroups (v1) here")
    listing = _run(executor, own, "find /sys/fs/cgroup -maxdepth 3 | sort")
    assert "dockyard-" not in listing  # no group of this executor, nor any other, by name
    # Its own groups are there, where tools look for their limits, read-only; of its memory
    # group (handed on between workspaces) only its limit and use.
    for controller in sorted(parents.keys() - {"memory"}):
        assert f"/sys/fs/cgroup/{controller}/cgroup.procs" in listing
    if "memory" in parents:
        shown = sorted(line for line in listing.split() if "/memory/" in line)
        assert shown == [f"/sys/fs/cgroup/memory/{name}" for name in sorted(SANDBOX_MEMORY_FILES)]
    written = _run(executor, own, "echo 1 > /sys/fs/cgroup/pids/pids.max; echo rc=$?")
    assert "rc=0" not in written
    # This executor's groups (another suite's executors come and go meanwhile: a machine-wide
    # glob met a group being removed).
    host_groups = sorted(p.name for parent in parents.values() for p in parent.iterdir()
                         if p.is_dir())
    assert len(host_groups) >= 2  # the host does have the neighbours' groups
    assert not any(name in listing for name in host_groups)


def _busy_pids(parents: dict[str, Path]) -> set[str]:
    """The host pids in this executor's workspaces' pids groups."""
    return {pid for group in parents["pids"].iterdir() if group.is_dir()
            for pid in (group / "cgroup.procs").read_text().split()}


def _memory_group_of(parents: dict[str, Path], session_pids: set[str]) -> Path:
    return next(group for group in parents["memory"].iterdir() if group.is_dir()
                and session_pids & set((group / "cgroup.procs").read_text().split()))


def test_a_memory_group_handed_on_shows_nothing_of_the_last_session(executor, demo_task):
    """A session's memory group goes to the next session: that one reads its limit there, never
    what the last one did (its peak, its use, its page faults, its OOM kills)."""
    _sandboxed(executor)
    parents = _parents(executor)
    if "memory" not in parents:
        pytest.skip("no memory cgroup (v1) here")
    first = _session(executor, demo_task)
    _run(executor, first, "head -c 300000000 /dev/zero > /tmp/big; rm /tmp/big")
    used = _memory_group_of(parents, _busy_pids(parents))  # (the only session here)
    assert int((used / "memory.max_usage_in_bytes").read_text()) >= 300_000_000
    assert executor.delete(f"/session/{first}").status_code == 200
    executor.work_dirs()  # (waits for the deleted session's removal)
    assert int((used / "memory.usage_in_bytes").read_text()) <= REUSE_SLACK_BYTES
    second = _session(executor, demo_task)
    _run(executor, second, "true")
    assert _memory_group_of(parents, _busy_pids(parents)) == used  # the same, handed on
    seen = _run(executor, second, "cd /sys/fs/cgroup/memory && for f in *; do echo $f $(cat $f);"
                                  " done")
    assert seen.split() == ["memory.limit_in_bytes", str(executor.settings.memory_limit_bytes)]
    assert list(SANDBOX_MEMORY_FILES) == ["memory.limit_in_bytes"]


def test_a_key_one_session_adds_is_refused_and_never_seen_by_another(executor, demo_task):
    sandbox = _sandboxed(executor)
    number = NATIVE_ADD_KEY.get(platform.machine())
    if number is None:
        pytest.skip(f"no filter for {platform.machine()}")
    assert sandbox["denied_syscalls"] == ["add_key", "request_key", "keyctl"]
    sender, receiver = _session(executor, demo_task), _session(executor, demo_task)
    said = _run(executor, sender, ADD_KEY.format(nr=number, description="covert-hello"))
    assert "add_key -1 Operation not permitted" in said, said
    if platform.machine() == "x86_64":  # the same call through the x32 ABI's numbering
        said = _run(executor, sender, ADD_KEY.format(nr=0x40000000 | number,
                                                     description="covert-x32"))
        assert "add_key -1 Operation not permitted" in said, said
    heard = _run(executor, receiver, "cat /proc/keys /proc/key-users; echo end")
    assert "covert" not in heard


# -- the filter itself, run by a classic-BPF interpreter over (architecture, call) -----------


def _evaluate(program: bytes, arch: int, nr: int) -> int:
    """What the kernel's seccomp would return for a call: the instructions the filter uses."""
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iI", nr, arch)
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            accumulator = struct.unpack("=I", data[k:k + 4])[0]
        elif code == 0x54:  # and #k
            accumulator &= k
        elif code == 0x15:  # jeq #k
            pc += jt if accumulator == k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


ALLOW, DENY = 0x7FFF0000, 0x00050000 | errno.EPERM
CASES = {
    # machine: [(arch, call, expected)]
    "x86_64": [(0xC000003E, 248, DENY), (0xC000003E, 249, DENY), (0xC000003E, 250, DENY),
               (0xC000003E, 0x40000000 | 250, DENY), (0xC000003E, 0, ALLOW),
               (0xC000003E, 251, ALLOW), (0xC000003E, 59, ALLOW),
               (0x40000003, 286, DENY), (0x40000003, 288, DENY), (0x40000003, 248, ALLOW),
               (0xC00000B7, 1, DENY)],
    "aarch64": [(0xC00000B7, 217, DENY), (0xC00000B7, 219, DENY), (0xC00000B7, 220, ALLOW),
                (0x40000028, 309, DENY), (0x40000028, 311, DENY), (0x40000028, 217, ALLOW),
                (0xC000003E, 1, DENY)],
}


@pytest.mark.parametrize("machine", sorted(CASES))
def test_the_filter_refuses_exactly_the_keyring_calls(machine):
    program = seccomp.program(machine)
    assert program is not None and len(program) % 8 == 0
    for arch, nr, expected in CASES[machine]:
        assert _evaluate(program, arch, nr) == expected, (machine, hex(arch), nr)


def test_no_filter_for_an_unknown_machine_is_reported(tmp_path):
    assert seccomp.program("sparc64") is None
    assert seccomp.write_filter(tmp_path / "f") is None or platform.machine() in CASES


# -- CPU: a group of one weight per workspace ---------------------------------------------


def test_each_workspace_has_a_cpu_group_of_the_same_weight(executor, demo_task):
    sandbox = _sandboxed(executor)
    parent = _parents(executor).get("cpu")
    if parent is None:
        pytest.skip(f"no cpu cgroup (v1) here: {sandbox['missing']}")
    weight = 1024  # cgroup v1's cpu.shares default, the same for every workspace
    assert sandbox["limits"]["cpu_weight"] == {"limit": weight, "enforced_by": "cgroup"}
    first, second = _session(executor, demo_task), _session(executor, demo_task)
    for session in (first, second):
        shares = _run(executor, session, "cat /sys/fs/cgroup/cpu/cpu.shares").split()
        assert shares == [str(weight)]
    members = {d.name: (d / "cgroup.procs").read_text().split() for d in parent.iterdir()
               if d.is_dir()}
    assert sum(1 for pids in members.values() if pids) >= 2  # each session in a group of its own
    # The parent weighs as its workspaces together, so each counts as one process outside.
    assert int((parent / "cpu.shares").read_text()) == weight * 2
    result = executor.submit(demo_task.request("fair", demo_task.gold_patch)).json()
    assert result["status"] == "resolved"
    assert result["conditions"]["cpu_weight"] == weight
    assert executor.delete(f"/session/{first}").status_code == 200
    assert executor.delete(f"/session/{second}").status_code == 200
    executor.work_dirs()  # (waits for the deleted sessions' removal)
    left = [d for d in parent.iterdir() if d.is_dir() and (d / "cgroup.procs").read_text()]
    assert left == []  # the groups left are kept for the next workspaces, and weigh nothing
    assert int((parent / "cpu.shares").read_text()) == weight


def test_cpu_fair_share_off_makes_no_cpu_groups(executor_factory, demo_task):
    executor = executor_factory(cpu_fair_share=False)
    sandbox = _sandboxed(executor)
    assert sandbox["limits"]["cpu_weight"] == {"limit": None, "enforced_by": None}
    result = executor.submit(demo_task.request("unfair", demo_task.gold_patch)).json()
    assert result["conditions"]["cpu_weight"] is None
