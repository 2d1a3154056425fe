"""Benchmark Dockyard's workspaces against ``git clone --local`` (issue 6, "Benchmark").

What is measured, on repositories made on the spot (never fetched from a git host):

* repositories: a generated git repository of ``--files`` small files (default 10,000) spread over
  nested directories in one commit, and with ``--django`` Django's source distribution from PyPI
  (``pip download django --no-binary :all:``; the wheel if no sdist) committed into a git repo;
* workspace create and destroy, in process, with the executor's own ``WorkspaceFactory`` wired as
  ``task_executor.app.Services.build`` wires it: the best mode this machine allows (``overlay``
  when overlayfs and mount namespaces work), its fallback ``git-clone`` (no namespaces, no
  templates), and the baseline ``git clone --local REPO DIR`` (which checks out) + ``rm -rf DIR``.
  The mirror clone and the cold create (which builds the template) are timed once; then the three
  methods alternate, in an order reversed at every repetition so that machine noise hits them
  alike, for ``--repeat`` repetitions (first warm create shown apart, then p50 / p90);
* session start through HTTP (unless ``--skip-http``): ``POST /session/start`` then
  ``DELETE /session/<id>`` on a real executor (``python -m task_executor serve --port 0``) in its
  best mode and on a second one started with ``DOCKYARD_WORKSPACE_MODE=git-clone``, interleaved;
* grading overhead on the small demo task (``python -m task_executor.demo``, the gold patch):
  wall time of ``POST /task/submit`` minus the result's ``phases.tests`` (the bare test command,
  timed inside the executor), for both executors, interleaved; every submit has its own task_id
  so the idempotency cache never answers.

Goals (issue 6): overlay create p50 <= 10 ms whatever the repository's size, >= 20x faster than
clone+checkout on the 10,000-file repository, grading overhead <= 100 ms p50.

Prints a plain table, then every figure as one JSON line. Nothing is asserted. In each
measurement loop the methods share ``--budget`` seconds: a method that has used its share stops
after at least 3 repetitions while quicker ones go on up to ``--repeat`` (the ``n`` column says
how many ran), so a slow disk cannot make the run unbounded. Everything lives in one temporary
directory that is removed at the end; mounts made below it are unmounted and the executors
stopped, on error and Ctrl-C too.
Needs root for the fast mode (mounts, namespaces); elsewhere it measures what the kernel allows.

    python scripts/bench/bench_workspaces.py [--files 10000] [--repeat 20] [--django]
                                             [--skip-http] [--budget 30]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_client.cli.fleet import descendants  # noqa: E402
from task_executor import isolation  # noqa: E402
from task_executor.config import Settings  # noqa: E402
from task_executor.grading.grader import sandbox_env  # noqa: E402
from task_executor.service.lifecycle import mounts_under  # noqa: E402
from task_executor.workspaces.gitcmd import git  # noqa: E402
from task_executor.workspaces.mirrors import MirrorCache  # noqa: E402
from task_executor.workspaces.templates import TemplateCache  # noqa: E402
from task_executor.workspaces.workspace import Workspace, WorkspaceFactory  # noqa: E402

FIXED_PATH = "/testbed"
MIN_REPS = 3
HTTP_TIMEOUT = 300.0
NO_CAPABILITIES = isolation.Capabilities(
    overlay=False, mount_namespace=False, network_namespace=False, reflink=False
)


# ---------------------------------------------------------------------------------- statistics


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(seconds: list[float]) -> dict[str, float]:
    """n, first, p50, p90, min, max of a list of durations in seconds, as milliseconds."""
    if not seconds:
        return {"n": 0}
    ms = [s * 1e3 for s in seconds]
    return {"n": len(ms), "first_ms": ms[0], "p50_ms": statistics.median(ms),
            "p90_ms": pct(ms, 90), "min_ms": min(ms), "max_ms": max(ms)}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def interleaved(names: list[str], repeat: int, budget: float,
                step: Callable[[str, int], None]) -> dict[str, int]:
    """Run ``step(name, rep)`` for every method at every repetition, in an order reversed every
    other repetition. A method whose steps have taken more than its share of ``budget`` (and
    that has ``MIN_REPS`` samples) stops there, while quicker ones go on up to ``repeat``; so a
    slow baseline bounds the loop's time without starving the figure under test of samples.
    Returns the number of repetitions each method ran."""
    share = budget / len(names)
    spent, done = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    for rep in range(repeat):
        live = [n for n in names if done[n] < MIN_REPS or spent[n] < share]
        if not live:
            break
        for name in live if rep % 2 == 0 else reversed(live):
            started = time.monotonic()
            step(name, rep)
            spent[name] += time.monotonic() - started
            done[name] += 1
    return done


# ---------------------------------------------------------------------------------- cleanup


class Cleanup:
    """Everything the benchmark must undo: live workspaces, servers, mounts, the temp dir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workspaces: list[Workspace] = []
        self.servers: list[subprocess.Popen[bytes]] = []
        self.made_fixed_path = False
        self.notes: list[str] = []

    def run(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut cleanup short
        for workspace in list(self.workspaces):
            try:
                workspace.destroy()
            except Exception as exc:  # keep cleaning
                self.notes.append(f"destroy {workspace.root}: {exc}")
        for proc in self.servers:
            stop_server(proc)
        left = mounts_under(self.workdir)
        for mount_point in sorted(left, key=len, reverse=True):
            for argv in (["umount", mount_point], ["umount", "-l", mount_point]):
                if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
                    break
        if left:
            self.notes.append(f"{len(left)} mount(s) were left below the work dir (unmounted)")
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.made_fixed_path:
            try:
                os.rmdir(FIXED_PATH)
            except OSError:
                pass
        for note in self.notes:
            print(f"cleanup: {note}", file=sys.stderr)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the executor drains and cleans up), SIGKILL after 30 s, then its leftovers."""
    if proc.poll() is not None:
        return
    kids = descendants(proc.pid)
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------- repositories


@dataclass
class Repo:
    name: str
    path: Path
    sha: str
    files: int
    size_bytes: int
    git_bytes: int
    probe: str
    """A file of the tree, checked in every workspace made (outside the timings)."""
    made_s: float

    def figures(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha": self.sha, "files": self.files,
                "size_bytes": self.size_bytes, "git_bytes": self.git_bytes,
                "made_s": round(self.made_s, 2)}


def tree_size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def commit_everything(path: Path, name: str, started: float) -> Repo:
    git(["init", "-q", "-b", "main"], cwd=path)
    git(["add", "-A", "--force", "."], cwd=path)
    git(["commit", "-q", "--no-verify", "-m", f"{name}: all files"], cwd=path)
    sha = git(["rev-parse", "HEAD"], cwd=path).stdout.decode().strip()
    listed = git(["ls-files", "-z"], cwd=path).stdout.split(b"\0")
    names = [item.decode() for item in listed if item]
    size = sum(os.lstat(path / item).st_size for item in names)
    probe = next((n for n in names if n.endswith(".py")), names[0])
    return Repo(name=name, path=path, sha=sha, files=len(names), size_bytes=size,
                git_bytes=tree_size(path / ".git"), probe=probe,
                made_s=time.monotonic() - started)


def make_generated(path: Path, files: int) -> Repo:
    """``files`` small Python files, 10 per leaf directory, three levels deep."""
    started = time.monotonic()
    for i in range(files):
        folder = path / f"pkg{i % 10}" / f"sub{i // 10 % 10}" / f"leaf{i // 100 % 100}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod_{i}.py").write_text(
            f'"""Generated module {i}."""\n\n\ndef value_{i}() -> int:\n    return {i}\n'
        )
    (path / "README.md").write_text(f"{files} generated files\n")
    return commit_everything(path, f"generated-{files}", started)


def make_django(workdir: Path) -> Repo:
    """Django's sdist (or wheel) from PyPI, extracted and committed into a git repository."""
    started = time.monotonic()
    download = workdir / "download"
    download.mkdir()
    base = [sys.executable, "-m", "pip", "download", "django", "--no-deps", "-q",
            "-d", str(download)]
    kind = "sdist"
    proc = subprocess.run([*base, "--no-binary", ":all:"], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0 or not list(download.glob("*.tar.gz")):
        print(f"  sdist download failed ({proc.stderr.strip()[-300:]}); trying the wheel",
              file=sys.stderr)
        kind = "wheel"
        subprocess.run([*base, "--only-binary", ":all:"], capture_output=True, timeout=600,
                       stdin=subprocess.DEVNULL, check=True)
    archive = sorted(download.iterdir())[0]
    extract = workdir / "django-extract"
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as tar:
            tar.extractall(extract, filter="data")
        (top,) = list(extract.iterdir())  # the sdist's single top-level directory
    else:
        with zipfile.ZipFile(archive) as wheel:
            wheel.extractall(extract)
        top = extract
    path = workdir / "repos" / "django"
    top.rename(path)
    repo = commit_everything(path, f"django {kind} ({archive.name})", started)
    shutil.rmtree(download, ignore_errors=True)
    shutil.rmtree(extract, ignore_errors=True)
    return repo


# ---------------------------------------------------------------------------------- in process


@dataclass
class Factories:
    mirrors: MirrorCache
    fast: WorkspaceFactory
    fallback: WorkspaceFactory
    capabilities: isolation.Capabilities


def build_factories(base: Path) -> Factories:
    """The executor's wiring (``Services.build``): best mode, and the git-clone fallback."""
    settings = Settings(base_dir=base)
    mirrors = MirrorCache(base / "mirrors")
    capabilities = isolation.detect(base)
    env_builder = functools.partial(sandbox_env, settings)
    sandbox = isolation.Sandbox(
        capabilities,
        fixed_path=isolation.prepare_fixed_path(FIXED_PATH, capabilities),
        hide=str(base),
    )
    fast = WorkspaceFactory(base / "work", mirrors, templates=None, sandbox=sandbox,
                            env_builder=env_builder, setup_timeout=settings.task_timeout)
    if sandbox.fixed_path is not None:
        fast.templates = TemplateCache(base / "templates", mirrors,
                                       run_setup=fast.template_setup,
                                       budget_bytes=settings.template_budget_bytes)
    fallback = WorkspaceFactory(
        base / "work-fallback", mirrors, templates=None,
        sandbox=isolation.Sandbox(NO_CAPABILITIES, fixed_path=None, hide=str(base)),
        env_builder=env_builder, setup_timeout=settings.task_timeout,
    )
    return Factories(mirrors, fast, fallback, capabilities)


def bench_workspaces(repo: Repo, fac: Factories, clones: Path, cleanup: Cleanup,
                     repeat: int, budget: float) -> dict[str, Any]:
    """Create/destroy: executor best mode, executor fallback, clone+checkout baseline."""
    fast_name = f"executor {fac.fast.mode}"
    fallback_name = f"executor {fac.fallback.mode} (fallback)"
    baseline_name = "git clone --local + rm -rf"
    out: dict[str, Any] = {"fast_mode": fac.fast.mode}
    out["mirror_clone_ms"] = timed(lambda: fac.mirrors.resolve(str(repo.path), repo.sha))[0] * 1e3

    def executor(factory: WorkspaceFactory) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        def create() -> Any:
            workspace = factory.create(str(repo.path), repo.sha)
            cleanup.workspaces.append(workspace)
            return workspace

        def destroy(workspace: Any) -> None:
            workspace.destroy()
            cleanup.workspaces.remove(workspace)

        return create, destroy

    def clone() -> Path:
        target = clones / uuid.uuid4().hex[:12]
        git(["clone", "--quiet", "--local", str(repo.path), str(target)])
        return target

    def remove(target: Path) -> None:
        subprocess.run(["rm", "-rf", str(target)], check=True, stdin=subprocess.DEVNULL)

    methods = {fast_name: executor(fac.fast), baseline_name: (clone, remove),
               fallback_name: executor(fac.fallback)}

    def tree_of(handle: Any) -> Path:
        return handle.path if isinstance(handle, Workspace) else handle

    # Cold: the first create in the best mode builds the template (the mirror is there already).
    create, destroy = methods[fast_name]
    cold, handle = timed(create)
    cold_ok = (tree_of(handle) / repo.probe).is_file()
    cold_destroy = timed(lambda: destroy(handle))[0]
    out["cold_create_ms"], out["cold_destroy_ms"] = cold * 1e3, cold_destroy * 1e3
    out["cold_ok"] = cold_ok

    samples: dict[str, dict[str, list[float]]] = {
        name: {"create": [], "destroy": []} for name in methods
    }
    errors = dict.fromkeys(methods, 0)

    def step(name: str, _rep: int) -> None:
        create, destroy = methods[name]
        took, handle = timed(create)
        samples[name]["create"].append(took)
        errors[name] += not (tree_of(handle) / repo.probe).is_file()
        samples[name]["destroy"].append(timed(lambda: destroy(handle))[0])

    interleaved(list(methods), repeat, budget, step)
    out["methods"] = {
        name: {"create": summary(s["create"]), "destroy": summary(s["destroy"]),
               "errors": errors[name]}
        for name, s in samples.items()
    }
    fast_p50 = out["methods"][fast_name]["create"]["p50_ms"]
    out["names"] = {"fast": fast_name, "baseline": baseline_name, "fallback": fallback_name}
    out["ratio_baseline_over_fast_create_p50"] = (
        out["methods"][baseline_name]["create"]["p50_ms"] / fast_p50
    )
    out["ratio_fallback_over_fast_create_p50"] = (
        out["methods"][fallback_name]["create"]["p50_ms"] / fast_p50
    )
    return out


# ---------------------------------------------------------------------------------- over HTTP


def check(reply: requests.Response) -> requests.Response:
    if not reply.ok:
        raise RuntimeError(f"{reply.request.method} {reply.url}: {reply.status_code} "
                           f"{reply.text[:2000]}")
    return reply


class Executor:
    """A ``task-executor serve`` subprocess on 127.0.0.1, port picked by the kernel."""

    def __init__(self, label: str, workdir: Path, extra_env: dict[str, str],
                 cleanup: Cleanup) -> None:
        self.label = label
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DOCKYARD_", "API_", "TASK_"))}
        env.update(extra_env)
        base = workdir / f"executor-{label}"
        out, self.log = workdir / f"{label}.out", base / "task_executor.log"
        with out.open("wb") as stdout, (workdir / f"{label}.err").open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1",
                 "--port", "0", "--base-dir", str(base)],
                stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=ROOT, env=env,
                start_new_session=True,
            )
        cleanup.servers.append(self.proc)
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (http://\S+)", out.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = (workdir / f"{label}.err").read_text()[-3000:]
                raise RuntimeError(f"executor {label} did not start:\n{err}")
            time.sleep(0.05)
        self.url = found.group(1)
        self.http = requests.Session()
        self.http.trust_env = False
        self.health = check(self.http.get(f"{self.url}/health", timeout=30)).json()
        self.mode = str(self.health["capabilities"]["workspace_mode"])

    def start(self, repo: Repo) -> str:
        body = {"repo": str(repo.path), "base_commit": repo.sha}
        reply = self.http.post(f"{self.url}/session/start", json=body, timeout=HTTP_TIMEOUT)
        return str(check(reply).json()["session_id"])

    def delete(self, session_id: str) -> None:
        check(self.http.delete(f"{self.url}/session/{session_id}", timeout=HTTP_TIMEOUT))

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        reply = self.http.post(f"{self.url}/task/submit", json=body, timeout=HTTP_TIMEOUT)
        return dict(check(reply).json())


def bench_sessions(repo: Repo, executors: list[Executor], repeat: int,
                   budget: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ex in executors:  # cold: mirror clone (and template build in the fast mode)
        took, sid = timed(lambda ex=ex: ex.start(repo))
        out[ex.label] = {"mode": ex.mode, "cold_start_ms": took * 1e3,
                         "cold_delete_ms": timed(lambda ex=ex, sid=sid: ex.delete(sid))[0] * 1e3}
    samples = {ex.label: {"start": [], "delete": []} for ex in executors}
    by_label = {ex.label: ex for ex in executors}

    def step(label: str, _rep: int) -> None:
        ex = by_label[label]
        took, sid = timed(lambda: ex.start(repo))
        samples[label]["start"].append(took)
        samples[label]["delete"].append(timed(lambda: ex.delete(sid))[0])

    interleaved(list(by_label), repeat, budget, step)
    for label, s in samples.items():
        out[label]["start"] = summary(s["start"])
        out[label]["delete"] = summary(s["delete"])
    return out


def bench_grading(task: dict[str, Any], executors: list[Executor], repeat: int,
                  budget: float) -> dict[str, Any]:
    """Overhead = wall time of POST /task/submit minus the result's phases.tests."""
    out: dict[str, Any] = {}
    walls: dict[str, list[float]] = {ex.label: [] for ex in executors}
    overheads: dict[str, list[float]] = {ex.label: [] for ex in executors}
    phases: dict[str, dict[str, list[float]]] = {ex.label: {} for ex in executors}
    bad: dict[str, list[str]] = {ex.label: [] for ex in executors}
    by_label = {ex.label: ex for ex in executors}

    def submit(ex: Executor, task_id: str) -> tuple[float, dict[str, Any]]:
        return timed(lambda: ex.submit({**task, "task_id": task_id}))

    for ex in executors:  # cold: mirror clone, template build, first pytest import
        took, result = submit(ex, f"bench-{ex.label}-cold-{uuid.uuid4().hex[:8]}")
        out[ex.label] = {"mode": ex.mode, "cold_wall_ms": took * 1e3,
                         "cold_status": result["status"],
                         "cold_tests_ms": result["phases"]["tests"] * 1e3}

    def step(label: str, rep: int) -> None:
        took, result = submit(by_label[label], f"bench-{label}-{rep}-{uuid.uuid4().hex[:8]}")
        walls[label].append(took)
        overheads[label].append(took - result["phases"]["tests"])
        for phase, seconds in result["phases"].items():
            phases[label].setdefault(phase, []).append(seconds)
        if result["status"] != "resolved":
            bad[label].append(f"{result['status']}: {result.get('error')}")

    interleaved(list(by_label), repeat, budget, step)
    for label in by_label:
        out[label].update({
            "wall": summary(walls[label]), "overhead": summary(overheads[label]),
            "phases_p50_ms": {p: statistics.median(v) * 1e3 for p, v in phases[label].items()},
            "not_resolved": len(bad[label]), "not_resolved_examples": bad[label][:3],
        })
    return out


# ---------------------------------------------------------------------------------- report


def row(label: str, s: dict[str, float], width: int = 34) -> str:
    if not s.get("n"):
        return f"  {label:<{width}}{'(no samples)':>10}"
    return (f"  {label:<{width}}{s['p50_ms']:>10.1f}{s['p90_ms']:>10.1f}{s['first_ms']:>10.1f}"
            f"{s['min_ms']:>10.1f}{s['max_ms']:>10.1f}{s['n']:>5}")


def header(title: str, width: int = 34) -> str:
    return (f"  {title:<{width}}{'p50 ms':>10}{'p90 ms':>10}{'first ms':>10}{'min ms':>10}"
            f"{'max ms':>10}{'n':>5}")


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(res: dict[str, Any]) -> None:
    print(f"machine: {res['cpus']} CPUs, kernel {res['kernel']}, {res['git']}; load average "
          f"{res['load_before']} -> {res['load_after']}")
    caps = res["capabilities"]
    print("capabilities: " + ", ".join(f"{k}={v}" for k, v in caps.items())
          + f"; best workspace mode: {res['fast_mode']}")
    print("\nrepositories:")
    for name, r in res["repos"].items():
        print(f"  {name:<44} {r['files']:>7} files {r['size_bytes'] / 2**20:>8.1f} MiB tree "
              f"{r['git_bytes'] / 2**20:>7.1f} MiB .git  (made in {r['made_s']:.1f} s)")
    for name, w in res["workspaces"].items():
        n = w["names"]
        print(f"\nworkspace create / destroy, in process -- {name}")
        print(f"  mirror clone (once) {w['mirror_clone_ms']:.0f} ms; cold create "
              f"{w['fast_mode']} (builds the template) {w['cold_create_ms']:.0f} ms, destroy "
              f"{w['cold_destroy_ms']:.1f} ms")
        print(header("create"))
        for method in (n["fast"], n["baseline"], n["fallback"]):
            print(row(method, w["methods"][method]["create"]))
        print(header("destroy"))
        for method in (n["fast"], n["baseline"], n["fallback"]):
            print(row(method, w["methods"][method]["destroy"]))
        errors = {m: v["errors"] for m, v in w["methods"].items() if v["errors"]}
        if errors:
            print(f"  trees missing their probe file: {errors}")
        fast_p50 = w["methods"][n["fast"]]["create"]["p50_ms"]
        ratio = w["ratio_baseline_over_fast_create_p50"]
        print(f"  create p50: baseline/{w['fast_mode']} = {ratio:.1f}x, fallback/"
              f"{w['fast_mode']} = {w['ratio_fallback_over_fast_create_p50']:.1f}x; "
              f"goal p50 <= 10 ms: {verdict(fast_p50 <= 10)}"
              + (f"; goal >= 20x: {verdict(ratio >= 20)}" if name.startswith("generated")
                 else ""))
    for name, s in res.get("sessions", {}).items():
        print(f"\nsession start / delete over HTTP -- {name}")
        print(header("POST /session/start"))
        for label, v in s.items():
            print(row(f"{label} ({v['mode']}, cold {v['cold_start_ms']:.0f} ms)", v["start"]))
        print(header("DELETE /session/<id>"))
        for label, v in s.items():
            print(row(f"{label} ({v['mode']})", v["delete"]))
    if "grading" in res:
        print("\ngrading the demo task (gold patch) over HTTP; overhead = wall - phases.tests")
        print(header("overhead"))
        for label, g in res["grading"].items():
            print(row(f"{label} ({g['mode']})", g["overhead"]))
        print(header("wall of POST /task/submit"))
        for label, g in res["grading"].items():
            print(row(f"{label} (cold {g['cold_wall_ms']:.0f} ms)", g["wall"]))
        for label, g in res["grading"].items():
            parts = ", ".join(f"{p} {v:.1f}" for p, v in g["phases_p50_ms"].items())
            print(f"  {label} phases p50 ms: {parts}; not resolved: {g['not_resolved']}"
                  + (f" {g['not_resolved_examples']}" if g["not_resolved"] else ""))
        fast = res["grading"].get("fast")
        if fast and fast["overhead"].get("n"):
            print(f"  goal overhead p50 <= 100 ms ({fast['mode']}): "
                  f"{verdict(fast['overhead']['p50_ms'] <= 100)}")


# ---------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000, help="files of the generated repo")
    parser.add_argument("--repeat", type=int, default=20, help="repetitions per measurement")
    parser.add_argument("--django", action="store_true", help="also Django's sdist from PyPI")
    parser.add_argument("--skip-http", action="store_true", help="in-process figures only")
    parser.add_argument("--budget", type=float, default=30.0,
                        help="seconds a measurement loop may take, shared by its methods; a "
                        "method over its share stops after 3 repetitions")
    args = parser.parse_args()
    if args.files < 1 or args.repeat < 1:
        parser.error("--files and --repeat must be positive")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Ctrl-C / SIGINT raises KeyboardInterrupt even where the shell started us ignoring it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="dockyard-bench-ws-")).resolve()
    cleanup = Cleanup(workdir)
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout
    res: dict[str, Any] = {
        "args": vars(args), "cpus": os.cpu_count(), "kernel": platform.release(),
        "git": git_version.strip(), "load_before": [round(x, 2) for x in os.getloadavg()],
        "repos": {}, "workspaces": {},
    }
    started = time.monotonic()
    try:
        if not os.path.isdir(FIXED_PATH):
            try:
                os.makedirs(FIXED_PATH)
                cleanup.made_fixed_path = True
            except OSError as exc:
                print(f"cannot create {FIXED_PATH} ({exc}): no fixed path", file=sys.stderr)
        (workdir / "repos").mkdir()
        print(f"making the {args.files}-file repository ...", file=sys.stderr, flush=True)
        repos = [make_generated(workdir / "repos" / "generated", args.files)]
        if args.django:
            print("downloading and committing Django ...", file=sys.stderr, flush=True)
            repos.append(make_django(workdir))
        for repo in repos:
            res["repos"][repo.name] = repo.figures()

        fac = build_factories(workdir / "inproc")
        res["capabilities"] = {k: getattr(fac.capabilities, k) for k in
                               ("overlay", "mount_namespace", "network_namespace", "reflink")}
        res["fast_mode"] = fac.fast.mode
        clones = workdir / "clones"
        clones.mkdir()
        for repo in repos:
            print(f"workspaces on {repo.name} ...", file=sys.stderr, flush=True)
            res["workspaces"][repo.name] = bench_workspaces(
                repo, fac, clones, cleanup, args.repeat, args.budget)

        if not args.skip_http:
            executors = [Executor("fast", workdir, {}, cleanup),
                         Executor("fallback", workdir, {"DOCKYARD_WORKSPACE_MODE": "git-clone"},
                                  cleanup)]
            res["http_modes"] = {ex.label: ex.mode for ex in executors}
            res["sessions"] = {}
            for repo in repos:
                print(f"sessions on {repo.name} ...", file=sys.stderr, flush=True)
                res["sessions"][repo.name] = bench_sessions(repo, executors, args.repeat,
                                                            args.budget)
            print("grading the demo task ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "task_executor.demo", "--image-python",
                            str(workdir / "demo")],
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL, timeout=120)
            task = json.loads((workdir / "demo" / "gold.json").read_text())
            task["env"] = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
            res["grading"] = bench_grading(task, executors, args.repeat, args.budget)
        res["load_after"] = [round(x, 2) for x in os.getloadavg()]
        res["elapsed_s"] = round(time.monotonic() - started, 1)
        report(res)
        print(f"\n(total {res['elapsed_s']} s)")
        print(json.dumps(res, sort_keys=True))
        return 0
    finally:
        cleanup.run()


if __name__ == "__main__":
    sys.exit(main())
