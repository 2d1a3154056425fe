"""A tiny SWE-bench-shaped task, made on the spot: a repo with a bug, its fix and held-out tests.

``python -m task_executor.demo DIR`` builds the repository under DIR and writes two request bodies
there, ``gold.json`` (the reference fix: resolved) and ``empty.json`` (no patch: unresolved), ready
for ``curl --data @DIR/gold.json``. Their ``setup`` builds the task's own test environment, as a
real task's does: a venv inside the tree with pytest installed from the package index (setup may
reach the network; it runs once per template), so the demo needs nothing of the machine's
``python3`` but the interpreter itself. ``--image-python`` leaves setup out and runs the tests with
the image's ``python3`` and its pytest, as the benchmarks and the test-suite's tasks do.
``python -m task_executor.demo summary [EXPECTED] < result.json`` prints one line about a verdict
and exits 1 (showing ``error`` / ``error_code`` and the log's tail) when it is not ``EXPECTED``.

The test-suite builds its fixture repositories with the same functions.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from task_executor.workspaces.gitcmd import git

BASE_FILES = {
    "calc/__init__.py": (
        '"""A calculator with a bug in add."""\n\n\n'
        "def add(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n"
    ),
    "tests/__init__.py": "",
    "tests/test_calc.py": (
        "from calc import mul\n\n\n"
        "def test_mul():\n    assert mul(3, 4) == 12\n"
    ),
}

FIXED_FILES = {
    "calc/__init__.py": BASE_FILES["calc/__init__.py"].replace("return a - b", "return a + b"),
}

TEST_FILES = {
    "tests/test_calc.py": (
        "import pytest\n\nfrom calc import add, mul\n\n\n"
        "def test_mul():\n    assert mul(3, 4) == 12\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        '@pytest.mark.parametrize("a,b,total", [(1, 2, 3), (0, 0, 0), (-1, 1, 0)])\n'
        "def test_add_many(a, b, total):\n    assert add(a, b) == total\n"
    ),
}

FAIL_TO_PASS = [
    "tests/test_calc.py::test_add",
    "tests/test_calc.py::test_add_many[1-2-3]",
    "tests/test_calc.py::test_add_many[-1-1-0]",
]
PASS_TO_PASS = ["tests/test_calc.py::test_mul", "tests/test_calc.py::test_add_many[0-0-0]"]

# The demo task's own test environment, made by its setup as a real task's is: the executor's venv
# is invisible to code under test, and the machine's python3 need not have pytest.
VENV_SETUP = ["python3 -m venv .venv", ".venv/bin/python -m pip install -q pytest"]
VENV_TEST_COMMAND = ".venv/bin/python -m pytest -p no:cacheprovider tests/test_calc.py"
# How the shell that runs the demo reaches the package index, passed on to setup (whose
# environment is built from scratch): a mirror, a proxy or a certificate bundle.
INDEX_VARIABLES = (
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST", "PIP_CERT",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
)


@dataclass(frozen=True)
class DemoTask:
    repo: str
    base_commit: str
    gold_patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    setup: list[str] = field(default_factory=list)
    test_command: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def request(self, task_id: str, patch: str) -> dict[str, object]:
        body: dict[str, object] = {
            "task_id": task_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "patch": patch,
            "test_patch": self.test_patch,
            "fail_to_pass": self.fail_to_pass,
            "pass_to_pass": self.pass_to_pass,
        }
        optional = {"setup": self.setup, "test_command": self.test_command, "env": self.env}
        body.update({name: value for name, value in optional.items() if value})
        return body

    def with_own_venv(self, environ: dict[str, str] | None = None) -> DemoTask:
        """This task with its test environment built by setup (``VENV_SETUP``)."""
        environ = dict(os.environ) if environ is None else environ
        index = {name: environ[name] for name in INDEX_VARIABLES if environ.get(name)}
        return replace(self, setup=list(VENV_SETUP), test_command=VENV_TEST_COMMAND, env=index)


def write_files(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)


def commit_all(repo: Path, message: str) -> str:
    git(["add", "-A"], cwd=repo)
    git(["commit", "-q", "--allow-empty", "-m", message], cwd=repo)
    return git(["rev-parse", "HEAD"], cwd=repo).stdout.decode().strip()


def diff_of(repo: Path, files: dict[str, str | bytes]) -> str:
    """The patch that turns HEAD into HEAD plus ``files``; the tree is left at HEAD."""
    write_files(repo, files)
    git(["add", "-A"], cwd=repo)
    patch = git(["diff", "--cached", "--binary", "HEAD"], cwd=repo).stdout.decode()
    git(["reset", "-q", "--hard", "HEAD"], cwd=repo)
    git(["clean", "-qfdx"], cwd=repo)
    return patch


def init_repo(path: Path, files: dict[str, str | bytes]) -> str:
    """A new repository at ``path`` holding ``files`` in one commit; returns the commit."""
    path.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", "main"], cwd=path)
    write_files(path, files)
    return commit_all(path, "base")


def make_demo_task(path: Path) -> DemoTask:
    base = init_repo(path, dict(BASE_FILES))
    return DemoTask(
        repo=str(path.resolve()),
        base_commit=base,
        gold_patch=diff_of(path, dict(FIXED_FILES)),
        test_patch=diff_of(path, dict(TEST_FILES)),
        fail_to_pass=list(FAIL_TO_PASS),
        pass_to_pass=list(PASS_TO_PASS),
    )


def summarize(result: dict) -> str:
    """One line about a TaskResult (or an error body), for people reading a terminal."""
    if "error" in result and isinstance(result["error"], dict):
        return f"error {result['error']['code']}: {result['error']['message']}"
    f2p = result["fail_to_pass"]
    required = len(f2p["passed"]) + len(f2p["failed"])
    return (
        f"{result['task_id']}: status={result['status']} resolved={result['resolved']} "
        f"fail_to_pass passed={len(f2p['passed'])}/{required} duration={result['duration_s']}s"
    )


def unexpected(result: dict, expected: str) -> str | None:
    """Why ``result`` is not a verdict of status ``expected`` (None when it is)."""
    if "error" in result and isinstance(result["error"], dict):
        return f"the executor refused the request: {summarize(result)}"
    if result.get("status") == expected:
        return None
    tail = "\n".join(str(result.get("log") or "").splitlines()[-15:])
    return (
        f"expected status={expected}, got status={result.get('status')} "
        f"error_code={result.get('error_code')}\nerror: {result.get('error')}"
        + (f"\nlog tail:\n{tail}" if tail else "")
    )


USAGE = (
    "usage: python -m task_executor.demo [--image-python] DIR\n"
    "       python -m task_executor.demo summary [EXPECTED_STATUS] < result.json"
)


def _summary(expected: str | None) -> int:
    text = sys.stdin.read()
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        print(f"not a JSON answer: {text[:500]!r}", file=sys.stderr)
        return 1
    print(summarize(result))
    problem = unexpected(result, expected) if expected else None
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["summary"] and len(args) <= 2:
        return _summary(args[1] if len(args) == 2 else None)
    image_python = "--image-python" in args
    args = [arg for arg in args if arg != "--image-python"]
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(args[0]).resolve()
    task = make_demo_task(root / "repo")
    if not image_python:
        task = task.with_own_venv()
    (root / "gold.json").write_text(json.dumps(task.request("demo-gold", task.gold_patch)))
    (root / "empty.json").write_text(json.dumps(task.request("demo-empty", "")))
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
