"""A tiny SWE-bench-shaped task, made on the spot: a repo with a bug, its fix and held-out tests.

``python -m task_executor.demo DIR`` builds the repository under DIR and writes two request bodies
there, ``gold.json`` (the reference fix: resolved) and ``empty.json`` (no patch: unresolved), ready
for ``curl --data @DIR/gold.json``. The test-suite builds its fixture repositories with the same
functions.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class DemoTask:
    repo: str
    base_commit: str
    gold_patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]

    def request(self, task_id: str, patch: str) -> dict[str, object]:
        return {
            "task_id": task_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "patch": patch,
            "test_patch": self.test_patch,
            "fail_to_pass": self.fail_to_pass,
            "pass_to_pass": self.pass_to_pass,
        }


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["summary"]:
        print(summarize(json.load(sys.stdin)))
        return 0
    if len(args) != 1:
        print("usage: python -m task_executor.demo DIR | summary < result.json", file=sys.stderr)
        return 2
    root = Path(args[0]).resolve()
    task = make_demo_task(root / "repo")
    (root / "gold.json").write_text(json.dumps(task.request("demo-gold", task.gold_patch)))
    (root / "empty.json").write_text(json.dumps(task.request("demo-empty", "")))
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
