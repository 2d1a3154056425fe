"""Connection churn against a dense executor (issue 24): new connections per second, errors.

Starts ``task-executor serve`` on a fresh base directory, opens ``--sessions`` live sessions on
a tiny git repo (about ten fds each in the executor: 120 put its new fds past 1,023, where a
select() loop died), then for ``--seconds`` opens a new connection per request (``GET /health``,
``Connection: close``) from ``--clients`` threads, and prints connections per second, errors,
the executor's fd count, and the time SIGTERM takes to shut it down with every session live.

    PYTHONPATH=$PWD python scripts/bench/bench_churn.py --sessions 120 --idle 200 --seconds 10
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests


def make_repo(where: Path) -> str:
    where.mkdir()
    (where / "README").write_text("churn\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=b", "-c", "user.email=b@b",
                                                  "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=where, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, check=True,
                          capture_output=True, text=True).stdout.strip()


def churn(url: str, seconds: float, clients: int) -> tuple[int, int]:
    ok, errors, lock = [0], [0], threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            try:
                good = requests.get(url + "/health", headers={"Connection": "close"},
                                    timeout=30).status_code == 200
            except requests.RequestException:
                good = False
            with lock:
                (ok if good else errors)[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ok[0], errors[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=120)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle", type=int, default=0,
                        help="keep-alive connections held open too (more fds: fewer low holes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-churn-") as tmp:
        base, repo = Path(tmp) / "base", Path(tmp) / "repo"
        commit = make_repo(repo)
        env = {**os.environ, "DOCKYARD_MAX_SESSIONS": str(args.sessions + 10)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port",
             "0", "--base-dir", str(base)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        try:
            with requests.Session() as pooled:
                for _ in range(args.sessions):
                    pooled.post(f"{url}/session/start", json={"repo": str(repo),
                                "base_commit": commit}, timeout=120).raise_for_status()
            host, port = url.removeprefix("http://").split(":")
            held = [http.client.HTTPConnection(host, int(port), timeout=30)
                    for _ in range(args.idle)]
            for conn in held:
                conn.request("GET", "/health")
                conn.getresponse().read()
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
            ok, errors = churn(url, args.seconds, args.clients)
            alive = proc.poll() is None
            for conn in held:
                conn.close()
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=600)
            shutdown_s = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"sessions={args.sessions} idle={args.idle} executor_fds={fds} "
          f"new_connections={ok + errors} "
          f"per_s={ok / args.seconds:.0f} errors={errors} alive_after={alive} "
          f"shutdown_s={shutdown_s:.2f} exit={code}")


if __name__ == "__main__":
    main()
