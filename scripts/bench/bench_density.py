"""Density of one executor (issue 24, part 4): what N live sessions cost, and how it behaves.

Starts ``python -m task_executor serve`` from this checkout on a fresh base directory under
/var/tmp (in a private copy of the machine's mount table, see bench_sandbox), with
``DOCKYARD_MAX_SESSIONS`` raised to fit, then:

1. DELETE at low density: ``--deletes`` sessions started and deleted with nothing else live
   (with ``--idle-stop``, once their shells are stopped, as they are at density);
   then ``--pairs`` sessions started and sent their first command at once, and 0.2 s later
   (an agent's model call): what ``--launch background`` (``DOCKYARD_SESSION_LAUNCH``) moves
   out of the start, and where it goes;
2. fills ``--sessions`` live sessions on a tiny git repo, one ``POST /session/start`` after the
   other, timing each: the start p50 / p99 by tenth of the run;
3. if ``--idle-stop`` (seconds) is given, it is the executor's ``DOCKYARD_SESSION_IDLE_STOP``:
   the run waits until the sessions hold no process (every shell stopped), or 5 minutes;
4. at density: PSS of the executor and its descendants per session (minus the same with none),
   processes per session, mounts per session (the executor's table, and every mount namespace
   a live process is in), fds in the executor;
5. exec: ``--execs`` ``true`` calls on one session (warm), then one call on each of ``--execs``
   other sessions (their first command since the fill: a stopped shell restores here);
6. DELETE at density: ``--deletes`` sessions (with ``--idle-stop``, once the shells step 5
   restored are stopped again: as with none live, nothing else is going on);
7. SIGTERM with every session live: time until the executor exits, and what it left (processes
   carrying its base directory's marker, mounts under the base directory, its cgroups).

Prints one line per figure, then the whole as one JSON line. Needs root (as the executor does).

    PYTHONPATH=$PWD python scripts/bench/bench_density.py --sessions 1000 [--idle-stop 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_churn import make_repo
from bench_sandbox import Client, family_pss_kib, private_mount_table, remove_cgroups
from bench_sessions import ROOT, descendants, pct, stop

from task_executor.grading.grader import OWNER_VARIABLE, owner_token
from task_executor.sandbox import reaper
from task_executor.service.lifecycle import mounts_under, unmount_under

TRUE = {"command": "true", "timeout": 60}


def ms_stats(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    if not ms:
        return {}
    return {"n": len(ms), "p50": round(pct(ms, 50), 2), "p99": round(pct(ms, 99), 2),
            "max": round(max(ms), 2)}


def serve(base: Path, sessions: int, idle_stop: float | None, log: Path,
          launch: str = "wait") -> tuple[Any, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "DOCKYARD_MAX_SESSIONS": str(sessions + 50), "DOCKYARD_SESSION_LAUNCH": launch}
    if idle_stop is not None:
        env["DOCKYARD_SESSION_IDLE_STOP"] = str(idle_stop)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port",
             "0", "--base-dir", str(base)],
            stdout=subprocess.PIPE, stderr=out, env=env, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line:
        raise RuntimeError(f"the executor did not start: {log.read_text()[-3000:]}")
    return proc, line.rsplit(" ", 1)[1]


def mount_figures(pid: int) -> dict[str, int]:
    """Mounts in the executor's table, and in every other mount namespace a process of its
    family is in (each read once, through one member)."""
    seen: dict[str, int] = {}
    for member in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            ns = os.readlink(f"/proc/{member}/ns/mnt")
            if ns not in seen:
                seen[ns] = len(Path(f"/proc/{member}/mountinfo").read_bytes().splitlines())
    own = seen.pop(os.readlink(f"/proc/{pid}/ns/mnt"), 0)
    return {"executor_table": own, "namespaces": len(seen), "in_namespaces": sum(seen.values())}


def snapshot(proc: Any) -> dict[str, Any]:
    pss, procs, by_command = family_pss_kib(proc.pid)
    return {"pss_kib": pss, "processes": procs, "by_command": by_command,
            "fds": len(os.listdir(f"/proc/{proc.pid}/fd")), "mounts": mount_figures(proc.pid)}


def per_session(at_n: dict[str, Any], empty: dict[str, Any], n: int) -> dict[str, float]:
    def each(a: float, b: float) -> float:
        return round((a - b) / max(1, n), 3)

    return {
        "pss_kib": each(at_n["pss_kib"], empty["pss_kib"]),
        "processes": each(at_n["processes"], empty["processes"]),
        "fds": each(at_n["fds"], empty["fds"]),
        "mounts_executor_table": each(at_n["mounts"]["executor_table"],
                                      empty["mounts"]["executor_table"]),
        "mounts_in_namespaces": each(at_n["mounts"]["in_namespaces"],
                                     empty["mounts"]["in_namespaces"]),
        "mount_namespaces_with_a_process": each(at_n["mounts"]["namespaces"],
                                                empty["mounts"]["namespaces"]),
    }


def fill(client: Client, body: dict[str, str], n: int) -> tuple[list[str], list[float], str]:
    ids: list[str] = []
    times: list[float] = []
    stopped = ""
    for _ in range(n):
        began = time.perf_counter()
        try:
            ids.append(client.post("/session/start", body)["session_id"])
        except RuntimeError as exc:
            stopped = str(exc)[:500]
            break
        times.append(time.perf_counter() - began)
        if len(ids) % max(1, n // 10) == 0:
            print(f"  {len(ids)} sessions, last start {times[-1] * 1000:.1f} ms", flush=True)
    return ids, times, stopped


def start_then_exec(client: Client, body: dict[str, str], pairs: int,
                    pause: float) -> dict[str, dict[str, float]]:
    """A session started and its first command sent ``pause`` seconds later (an agent's model
    call between them), ``pairs`` times, one after the other: each call's time, and the start
    and the command together (the pause not counted)."""
    starts, execs, both = [], [], []
    for _ in range(pairs):
        began = time.perf_counter()
        sid = client.post("/session/start", body)["session_id"]
        started = time.perf_counter()
        time.sleep(pause)
        sent = time.perf_counter()
        client.post(f"/session/{sid}/exec", TRUE)
        done = time.perf_counter()
        starts.append(started - began)
        execs.append(done - sent)
        both.append(done - sent + started - began)
        client.send("DELETE", f"/session/{sid}")
    return {"start": ms_stats(starts), "first_exec": ms_stats(execs), "together": ms_stats(both)}


def by_tenth(times: list[float]) -> list[dict[str, float]]:
    tenth = max(1, len(times) // 10)
    return [ms_stats(times[i:i + tenth]) for i in range(0, len(times), tenth)][:10]


def timed_calls(calls: list[Any]) -> list[float]:
    times = []
    for call in calls:
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def wait_stopped(proc: Any, empty_processes: int, limit_s: float = 300.0) -> dict[str, Any]:
    """Wait until the executor's sessions hold no process (every shell parked), or the limit."""
    began = time.monotonic()
    left = -1
    while time.monotonic() - began < limit_s:
        left = len(descendants(proc.pid)) + 1 - empty_processes
        if left <= 0:
            break
        time.sleep(1.0)
    return {"session_processes_left": left, "waited_s": round(time.monotonic() - began, 1)}


def leftovers(base: Path) -> dict[str, int]:
    """What the executor on ``base`` left: processes carrying its owner variable, mounts under
    its base directory, its cgroup directories, working trees."""
    token = owner_token(base)
    owned = reaper.find(reaper.Target(environment=(f"{OWNER_VARIABLE}={token}",)))
    groups = [*Path("/sys/fs/cgroup").glob(f"*/dockyard-{token}"),
              Path("/sys/fs/cgroup") / f"dockyard-{token}"]
    work = base / "work"
    return {"processes": len(owned), "mounts_under_base": len(mounts_under(base)),
            "cgroup_directories": sum(1 for g in groups if g.is_dir()),
            # Left for the next start once the grace is over (lifecycle.remove_work).
            "trees": len([*work.glob("ws-*"), *work.glob("holders-*/ws-*")])}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    repo = work / "repo"
    commit = make_repo(repo)
    base = work / "base"
    proc, url = serve(base, args.sessions, args.idle_stop, work / "executor.log", args.launch)
    res: dict[str, Any] = {"sessions_asked": args.sessions, "idle_stop_s": args.idle_stop,
                           "launch": args.launch}
    try:
        client = Client(url)
        body = {"repo": str(repo), "base_commit": commit}
        client.send("DELETE", f"/session/{client.post('/session/start', body)['session_id']}")
        time.sleep(1.0)
        empty = snapshot(proc)
        low = [client.post("/session/start", body)["session_id"] for _ in range(args.deletes)]
        if args.idle_stop is not None:  # deleted as the ones at density will be: stopped
            time.sleep(args.idle_stop + 1.0)  # (a background launch comes first, if any)
            res["idle_wait_at_0"] = wait_stopped(proc, empty["processes"])
        res["delete_at_0"] = ms_stats(timed_calls(
            [lambda s=s: client.send("DELETE", f"/session/{s}") for s in low]))
        for pause in (0.0, 0.2):
            res[f"start_then_exec_after_{pause}s"] = start_then_exec(client, body, args.pairs,
                                                                     pause)
        ids, times, res["fill_stopped_by"] = fill(client, body, args.sessions)
        n = len(ids)
        res["sessions"] = n
        res["start_by_tenth"] = by_tenth(times)
        res["start_all"] = ms_stats(times)
        if args.idle_stop is not None:
            res["idle_wait"] = wait_stopped(proc, empty["processes"])
        time.sleep(1.0)
        at_n = snapshot(proc)
        res["at_n"] = {k: v for k, v in at_n.items() if k != "by_command"}
        res["per_session"] = per_session(at_n, empty, n)
        res["pss_kib_per_session_by_command"] = {
            k: round((v - empty["by_command"].get(k, 0)) / max(1, n), 1)
            for k, v in at_n["by_command"].items()}
        warm = ids[0]
        for _ in range(10):
            client.post(f"/session/{warm}/exec", TRUE)
        res["exec_warm"] = ms_stats(timed_calls(
            [lambda: client.post(f"/session/{warm}/exec", TRUE)] * args.execs))
        others = random.Random(1).sample(ids[1:], min(args.execs, n - 1))
        res["exec_first_after_fill"] = ms_stats(timed_calls(
            [lambda s=s: client.post(f"/session/{s}/exec", TRUE) for s in others]))
        if args.idle_stop is not None:  # the shells the calls above restored, stopped again
            time.sleep(args.idle_stop + 1.0)
            res["idle_wait_before_deletes"] = wait_stopped(proc, empty["processes"])
        gone = random.Random(2).sample(ids, min(args.deletes, n))
        res["delete_at_n"] = ms_stats(timed_calls(
            [lambda s=s: client.send("DELETE", f"/session/{s}") for s in gone]))
        res["health"] = client.send("GET", "/health")
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        res["exit_code"] = proc.wait(timeout=3600)
        res["shutdown_s"] = round(time.monotonic() - began, 2)
        res["sessions_at_shutdown"] = n - len(gone)
        time.sleep(0.5)
        res["left_after_shutdown"] = leftovers(base)
    finally:
        stop(proc)
        remove_cgroups(base)
    return res


def report(res: dict[str, Any]) -> None:
    print(f"sessions: {res['sessions']} of {res['sessions_asked']}"
          f" {('(stopped: ' + res['fill_stopped_by'] + ')') if res['fill_stopped_by'] else ''}")
    for i, tenth in enumerate(res["start_by_tenth"]):
        print(f"  start, tenth {i + 1}: p50 {tenth['p50']} ms, p99 {tenth['p99']} ms")
    print(f"start, whole run: {res['start_all']}")
    for key in [k for k in res if k.startswith("start_then_exec")]:
        print(f"{key.replace('_', ' ')} (none live): {res[key]}")
    if "idle_wait" in res:
        print(f"idle stop: {res['idle_wait']}")
    print(f"per session: {res['per_session']}")
    print(f"PSS KiB per session by command: {res['pss_kib_per_session_by_command']}")
    print(f"exec, one warm session: {res['exec_warm']}")
    print(f"exec, first call on other sessions: {res['exec_first_after_fill']}")
    print(f"DELETE with none live: {res['delete_at_0']}")
    print(f"DELETE at density: {res['delete_at_n']}")
    print(f"SIGTERM with {res['sessions_at_shutdown']} live: exit {res['exit_code']} in "
          f"{res['shutdown_s']} s; left: {res['left_after_shutdown']}")
    print(json.dumps(res))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--deletes", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=20,
                        help="sessions started and sent a first command, before the fill")
    parser.add_argument("--launch", choices=("wait", "background"), default="wait",
                        help="DOCKYARD_SESSION_LAUNCH for the executor")
    parser.add_argument("--idle-stop", type=float, default=None,
                        help="DOCKYARD_SESSION_IDLE_STOP for the executor (seconds)")
    args = parser.parse_args()
    print(f"mount table: {private_mount_table()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-density-", dir="/var/tmp"))
    work.chmod(0o711)
    try:
        report(run(args, work))
    finally:
        unmount_under(work)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
