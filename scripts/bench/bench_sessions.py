"""Benchmark Dockyard's session routes, side by side with SWE-ReX's ``run_in_session``.

Against a real executor (and ``swerex-remote``) started as subprocesses on 127.0.0.1, measures:
``echo hi`` round-trip latency through HTTP in a live session, p50/p90/p99 over ``--calls`` calls
after 20 warm-ups, every system x client pair alternating in ``--blocks`` interleaved blocks so
machine noise hits all alike (Dockyard's syntax check is always on; SWE-ReX runs with
``check: "silent"``). Each server is timed through two HTTP clients, each on one kept-alive
connection: ``http.client`` (the standard library's, the thinnest Python client: what the
servers cost) and ``requests`` (what most Python callers use; it adds about 1 ms a call on this
machine, to every server alike), and Dockyard also through the trainer's own
``RemoteSession.exec`` (``requests`` plus the protocol models). A third server is the floor: a
bare Flask app on waitress that answers the same JSON without running anything;
session start time (median of ``--starts`` start + close cycles); executor memory per idle
session at ``--sessions`` sessions (VmRSS of the executor, and of executor + shells: RSS sum and
the shells' PSS), then RSS and children left after deleting them all; and a 16 MiB output
(``head -c 16777216 /dev/zero | tr '\\0' a``): wall time and reply size. Prints a plain-text
table, then every figure as one JSON line. Nothing is asserted.

    python scripts/bench/bench_sessions.py --setup-swerex   # once: venv at /tmp/bench-venv
    python scripts/bench/bench_sessions.py [--calls 500] [--sessions 100] [--skip-swerex]

``--setup-swerex`` creates that venv (``python3 -m venv`` + ``pip install swe-rex``) so SWE-ReX
never enters the project's own environment; ``--venv`` picks another location.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_client import RemoteSession, SandboxClient  # noqa: E402
from sandbox_client.cli.fleet import descendants  # noqa: E402
from task_executor.service.lifecycle import unmount_under  # noqa: E402

ECHO = "echo hi"
CLIENTS = ("http.client", "requests")
FLOOD = "head -c 16777216 /dev/zero | tr '\\0' 'a'"
WARMUP = 20
Run = Callable[[], dict[str, Any]]
"""One ``echo hi`` call; returns the answer's JSON (``exit_code``, ``output``)."""


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def mem_kib(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` from /proc/<pid>/status, or ``Pss`` from smaps_rollup; 0 if the pid is gone."""
    try:
        text = Path(f"/proc/{pid}/{'smaps_rollup' if field == 'Pss' else 'status'}").read_text()
    except OSError:
        return 0
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else 0


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a server's process group, then every descendant that left it (shells, ptys)."""
    kids = descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, sig)
            proc.wait(5)
        if proc.poll() is not None:
            break
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def check(reply: requests.Response) -> requests.Response:
    if not reply.ok:
        raise RuntimeError(f"{reply.url}: {reply.status_code} {reply.text[:2000]}")
    return reply


class RawHTTP:
    """POSTs JSON over one kept-alive ``http.client`` connection.

    A connection the server closed while idle (uvicorn, under SWE-ReX, drops them after 5 s) is
    reopened before the call, inside its timing, as ``requests`` (urllib3) does.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        sock = self.conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:  # readable when idle: EOF
            self.conn.close()
        self.conn.request("POST", path, body=json.dumps(body), headers=self.headers)
        reply = self.conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{path}: {reply.status} {data[:2000]!r}")
        return dict(json.loads(data))


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def spawn(cmd: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # a file, not a pipe: a chatty server never blocks on it
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **kw)


def http_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def wait_ready(proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], Any]) -> Any:
    """Poll ``ready()`` until it returns something truthy; fail if the server dies or hangs."""
    deadline = time.monotonic() + 60
    while not (found := ready()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args} did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return found


class Dockyard:
    def __init__(self, workdir: Path, max_sessions: int, servers: list[Any]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("API_TOKEN", "API_PORT")}
        env["DOCKYARD_MAX_SESSIONS"] = str(max_sessions)
        log = workdir / "executor.out"
        self.proc = spawn([sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1",
                           "--port", "0", "--base-dir", str(workdir / "base")],
                          log, cwd=ROOT, env=env)
        servers.append(self.proc)
        ready = wait_ready(self.proc, log,
                           lambda: re.search(r"listening on (http://\S+)", log.read_text()))
        self.url, self.http = ready.group(1), http_session()

    def start(self, repo: str, commit: str) -> str:
        body = {"repo": repo, "base_commit": commit}
        return str(check(self.http.post(f"{self.url}/session/start", json=body)).json()[
            "session_id"])

    def delete(self, sid: str) -> None:
        check(self.http.delete(f"{self.url}/session/{sid}"))

    def run(self, sid: str, command: str, timeout: float = 60) -> requests.Response:
        return self.http.post(f"{self.url}/session/{sid}/exec",
                              json={"command": command, "timeout": timeout}, timeout=timeout + 30)

    def runners(self, sid: str, command: str, remote: RemoteSession) -> dict[str, Run]:
        """``command`` in session ``sid`` through each client (``remote``: a session of its own
        opened by the trainer's client)."""
        raw = RawHTTP(self.url)
        body = {"command": command, "timeout": 60}
        return {"http.client": lambda: raw.post(f"/session/{sid}/exec", body),
                "requests": lambda: check(self.run(sid, command)).json(),
                "RemoteSession": lambda: remote.exec(command, timeout=60).model_dump()}


BARE_APP = """
import sys
from flask import Flask, jsonify, request
from waitress import create_server
app = Flask("bare")
@app.post("/exec")
def run():
    request.get_json()
    return jsonify(exit_code=0, output="hi\\n")
server = create_server(app, host="127.0.0.1", port=0)
print(f"listening on http://127.0.0.1:{server.effective_port}", flush=True)
server.run()
"""


class BareFlask:
    """The floor: a Flask app on waitress that answers ``echo hi``'s JSON without running it."""

    def __init__(self, workdir: Path, servers: list[Any]) -> None:
        log = workdir / "bare.out"
        self.proc = spawn([sys.executable, "-c", BARE_APP], log)
        servers.append(self.proc)
        ready = wait_ready(self.proc, log,
                           lambda: re.search(r"listening on (http://\S+)", log.read_text()))
        self.url, self.http = ready.group(1), http_session()

    def runners(self) -> dict[str, Run]:
        raw, body = RawHTTP(self.url), {"command": ECHO}
        return {"http.client": lambda: raw.post("/exec", body),
                "requests": lambda: check(self.http.post(f"{self.url}/exec", json=body)).json()}


class SweRex:
    def __init__(self, venv: Path, workdir: Path, servers: list[Any]) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url, token = f"http://127.0.0.1:{port}", secrets.token_hex(16)
        self.http = http_session()
        log = workdir / "swerex.out"
        self.proc = spawn([str(venv / "bin" / "swerex-remote"), "--host", "127.0.0.1",
                           "--port", str(port), "--auth-token", token], log, cwd=workdir)
        servers.append(self.proc)
        self.http.headers["X-API-Key"] = token
        wait_ready(self.proc, log, self.alive)

    def alive(self) -> bool:
        try:
            return self.http.get(f"{self.url}/is_alive", timeout=2).ok
        except requests.ConnectionError:
            return False

    def start(self, name: str) -> None:
        # startup_timeout defaults to 1 s, which a loaded 2-core machine sometimes misses (511)
        body = {"session": name, "session_type": "bash", "startup_timeout": 10}
        check(self.http.post(f"{self.url}/create_session", json=body))

    def close(self, name: str) -> None:
        body = {"session": name, "session_type": "bash"}
        check(self.http.post(f"{self.url}/close_session", json=body))

    def run(self, name: str, command: str, timeout: float = 60) -> requests.Response:
        # Action is a union discriminated by action_type, which must be sent (422 without it).
        return self.http.post(f"{self.url}/run_in_session", json=self.body(name, command, timeout),
                              timeout=timeout + 30)

    @staticmethod
    def body(name: str, command: str, timeout: float = 60) -> dict[str, Any]:
        return {"command": command, "session": name, "action_type": "bash",
                "check": "silent", "timeout": timeout}

    def runners(self, name: str, command: str) -> dict[str, Run]:
        raw = RawHTTP(self.url, {"X-API-Key": self.http.headers["X-API-Key"]})
        body = self.body(name, command)
        return {"http.client": lambda: raw.post("/run_in_session", body),
                "requests": lambda: check(self.run(name, command)).json()}


def interleaved(runs: dict[str, Callable[[], Any]], calls: int,
                blocks: int) -> dict[str, list[tuple[float, Any]]]:
    """(seconds, result) of ``calls`` calls of each run after ``WARMUP`` warm-ups, the runs
    taking turns in ``blocks`` blocks, every other block in reverse order, so machine noise hits
    them alike."""
    timings: dict[str, list[tuple[float, Any]]] = {name: [] for name in runs}
    for run in runs.values():
        for _ in range(WARMUP):
            run()
    for block in range(blocks):
        for name in list(runs) if block % 2 == 0 else list(reversed(runs)):
            for _ in range(calls // blocks + (block < calls % blocks)):
                timings[name].append(timed(runs[name]))
    return timings


def latency(runs: dict[str, Run], calls: int, blocks: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, timings in interleaved(runs, calls, blocks).items():
        s = [took for took, _ in timings]
        errors = sum(not (data.get("exit_code") == 0 and data.get("output", "").strip() == "hi")
                     for _, data in timings)
        inner = [data["duration_s"] for _, data in timings if "duration_s" in data]
        out[name] = {"calls": len(s), "errors": errors, "mean_ms": statistics.fmean(s) * 1e3,
                     **{f"p{p}_ms": pct(s, p) * 1e3 for p in (50, 90, 99)}}
        if inner:
            out[name]["server_duration_p50_ms"] = pct(inner, 50) * 1e3
    return out


def flood(run: Run) -> dict[str, Any]:
    try:
        took, reply = timed(run)
    except requests.RequestException as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    is_json = reply.headers.get("content-type", "").startswith("application/json")
    data = reply.json() if is_json else {}
    out = {"wall_s": took, "http_status": reply.status_code, "reply_bytes": len(reply.content),
           "output_chars": len(data.get("output", "")), "exit_code": data.get("exit_code")}
    out |= {k: data[k] for k in ("output_bytes", "truncated", "timed_out") if k in data}
    if "swerexception" in data:  # SWE-ReX ships its exception as a 511 body
        exc = data["swerexception"]
        out["error"] = f"{exc.get('class_path')}: {exc.get('message', '')[:160]}"
    return out


def memory(dock: Dockyard, repo: str, commit: str, n: int) -> dict[str, float]:
    pid = dock.proc.pid
    before, before_kids = mem_kib(pid), sum(map(mem_kib, descendants(pid)))
    sids = [dock.start(repo, commit) for _ in range(n)]
    time.sleep(0.5)
    after, kids = mem_kib(pid), descendants(pid)
    kids_rss, kids_pss = sum(map(mem_kib, kids)), sum(mem_kib(k, "Pss") for k in kids)
    for sid in sids:
        dock.delete(sid)
    time.sleep(1.0)
    return {"sessions": n, "rss_before_mib": before / 1024, "rss_at_n_mib": after / 1024,
            "executor_kib_per_session": (after - before) / n, "shell_processes": len(kids),
            "with_shells_rss_kib_per_session": (after - before + kids_rss - before_kids) / n,
            "shells_pss_kib_per_session": kids_pss / n,
            "rss_after_delete_mib": mem_kib(pid) / 1024,
            "children_after_delete": len(descendants(pid))}


def report(res: dict[str, Any]) -> None:
    lat = res["latency"]
    print(f"load average {res['load_before']} -> {res['load_after']} on {res['cpus']} CPUs\n")
    print(f"{'echo hi round trip':<28}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}"
          f"{'calls':>7}{'errors':>7}  server-side p50")
    for name, s in lat.items():
        inner = s.get("server_duration_p50_ms")
        print(f"{name:<28}{s['p50_ms']:>9.2f}{s['p90_ms']:>9.2f}{s['p99_ms']:>9.2f}"
              f"{s['mean_ms']:>9.2f}{s['calls']:>7}{s['errors']:>7}  "
              + (f"{inner:.2f} ms (duration_s)" if inner is not None else "-"))
    for client in CLIENTS:
        dock, rex = lat.get(f"dockyard {client}"), lat.get(f"swerex {client}")
        if dock is None or rex is None:
            continue
        ratios = (f"{p} SWE-ReX/Dockyard = {rex[f'{p}_ms'] / dock[f'{p}_ms']:.1f}x"
                  for p in ("p50", "p99"))
        print(f"through {client}: " + "; ".join(ratios))
    for client in CLIENTS:
        d = lat[f"dockyard {client}"]
        print(f"goal through {client}: p50 <= 2 ms {'met' if d['p50_ms'] <= 2 else 'MISSED'}; "
              f"p99 <= 10 ms {'met' if d['p99_ms'] <= 10 else 'MISSED'}")
    print("\nsession start, median: " + "; ".join(
        f"{k} {v['median_ms']:.1f} ms (min {v['min_ms']:.1f}, n={v['n']})"
        for k, v in res["start"].items()))
    m = res["memory"]
    print(f"\nmemory at {m['sessions']} idle sessions: executor RSS {m['rss_before_mib']:.1f} -> "
          f"{m['rss_at_n_mib']:.1f} MiB = {m['executor_kib_per_session']:.0f} KiB/session;\n"
          f"  executor + shells: {m['with_shells_rss_kib_per_session']:.0f} KiB/session (RSS sum)"
          f", shells alone {m['shells_pss_kib_per_session']:.0f} KiB/session (PSS), "
          f"{m['shell_processes']} child processes;\n  after DELETE of all: RSS "
          f"{m['rss_after_delete_mib']:.1f} MiB, {m['children_after_delete']} children left")
    print("\n16 MiB output:")
    for name, f in res["flood"].items():
        print(f"  {name:<9} " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in f.items()))


def starts(n: int, start: Callable[[int], Any], close: Callable[[Any], None]) -> dict[str, Any]:
    took = []
    for i in range(n):
        seconds, handle = timed(lambda i=i: start(i))
        took.append(seconds * 1e3)
        close(handle)
    return {"n": n, "median_ms": statistics.median(took), "min_ms": min(took)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="measured echo calls per system")
    parser.add_argument("--blocks", type=int, default=10, help="interleaved blocks")
    parser.add_argument("--sessions", type=int, default=100, help="idle sessions for memory")
    parser.add_argument("--starts", type=int, default=20, help="session starts to time")
    parser.add_argument("--skip-swerex", action="store_true", help="measure Dockyard only")
    parser.add_argument("--setup-swerex", action="store_true", help="create the SWE-ReX venv")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/bench-venv"))
    parser.add_argument("--flood-timeout", type=float, default=300.0, help="seconds, per system")
    args = parser.parse_args()
    if args.setup_swerex:
        if not (args.venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
        subprocess.run([str(args.venv / "bin" / "pip"), "install", "-q", "swe-rex"], check=True)
    if not args.skip_swerex and not (args.venv / "bin" / "swerex-remote").exists():
        parser.error(f"no swerex-remote in {args.venv}: pass --setup-swerex or --skip-swerex")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # both end in the finally below
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    workdir = Path(tempfile.mkdtemp(prefix="dockyard-bench-"))
    workdir.chmod(0o755)  # the sandbox uid must reach the base dir below it (fail closed else)
    servers: list[subprocess.Popen[bytes]] = []
    res: dict[str, Any] = {"calls": args.calls, "cpus": os.cpu_count(), "start": {},
                           "load_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        subprocess.run([sys.executable, "-m", "task_executor.demo", "--image-python",
                        str(workdir / "demo")],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        gold = json.loads((workdir / "demo" / "gold.json").read_text())
        repo, commit = gold["repo"], gold["base_commit"]
        dock = Dockyard(workdir, max(64, args.sessions + 8), servers)
        rex = None if args.skip_swerex else SweRex(args.venv, workdir, servers)

        dock.delete(dock.start(repo, commit))  # warm-up: the first start builds the mirror
        res["start"]["dockyard"] = starts(args.starts, lambda _: dock.start(repo, commit),
                                          dock.delete)
        if rex:
            res["start"]["swerex"] = starts(args.starts, lambda i: rex.start(f"s{i}") or f"s{i}",
                                            rex.close)
        res["memory"] = memory(dock, repo, commit, args.sessions)

        sid = dock.start(repo, commit)
        remote = SandboxClient([dock.url]).start_session({"repo": repo, "base_commit": commit})
        runs = {f"dockyard {client}": run
                for client, run in dock.runners(sid, ECHO, remote).items()}
        runs |= {f"bare flask {client}": run
                 for client, run in BareFlask(workdir, servers).runners().items()}
        if rex:
            rex.start("bench")
            runs |= {f"swerex {client}": run for client, run in rex.runners("bench", ECHO).items()}
        res["latency"] = latency(runs, args.calls, args.blocks)
        remote.close()

        res["flood"] = {"dockyard": flood(lambda: dock.run(sid, FLOOD, args.flood_timeout))}
        if rex:  # last: pexpect's buffering makes this slow, and a timeout wedges the session
            res["flood"]["swerex"] = flood(lambda: rex.run("bench", FLOOD, args.flood_timeout))
        dock.delete(sid)
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
        report(res)
        print(json.dumps(res, sort_keys=True))
        return 0
    finally:
        for proc in servers:
            stop(proc)
        unmount_under(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
