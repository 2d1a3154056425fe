"""A failure caused by the agent's own bytes is a verdict on the agent, never "no verdict".

The executor reads the agent's versions of setup.cfg and pyproject.toml to put their
test-configuring sections back. Each file here once turned a grading into ``execution_error``
(``internal_error``), or held the GIL for tens of seconds: a 17 MiB file sent as a small binary
patch, a deeply nested one, bytes no parser takes, and one line that made the table-header regex
backtrack cubically. Every one is now graded, through the real route and through a session's
finish, while ``/health`` goes on answering.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from task_executor.demo import FIXED_FILES, diff_of
from task_executor.grading import testconfig
from tests.conftest import FAST_PYTEST_ENV

NO_VERDICT = {"execution_error"}

HUGE = b"[tool.pytest.ini_options]\naddopts = '-p no:python'\n\0" + b"x" * (17 * 1024 * 1024)
NESTED = b"[tool.pytest.ini_options]\nx = " + b"[" * 50_000 + b"]" * 50_000 + b"\n"
BACKTRACKING = b"[" + b" " * 2000 + b"x" * 2000 + b" " * 2000 + b"\n"
AGENT_FILES = {
    "huge-pyproject": ("pyproject.toml", HUGE),
    "nested-pyproject": ("pyproject.toml", NESTED),
    "backtracking-pyproject": ("pyproject.toml", BACKTRACKING * 4),
    "backtracking-setup-cfg": ("setup.cfg", BACKTRACKING * 4),
    # configparser's own option regex is quadratic in a line of blanks with no delimiter.
    "blank-line-setup-cfg": ("setup.cfg", b"[tool:pytest]\n" + b" " * 400_000 + b"x\n"),
    "nul-setup-cfg": ("setup.cfg", b"[tool:pytest]\naddopts = -p no:python\n\0\xff\xfe"),
    "bad-utf8-pyproject": ("pyproject.toml", b"[tool.pytest.ini_options]\nx = '\xff\xfe'\n"),
    "duplicate-sections": ("setup.cfg", b"[tool:pytest]\na=1\n[tool:pytest]\na=2\n"),
    "directory-as-pyproject": ("pyproject.toml/inner.txt", b"x\n"),
}


def binary_diff(repo: Path, files: dict[str, bytes]) -> str:
    """``diff_of`` with every file as a GIT binary patch (base85 of the exact bytes, as a JSON
    string can carry bytes that are not UTF-8), through the repository's own attributes file,
    which is not part of the patch."""
    attributes = repo / ".git" / "info" / "attributes"
    attributes.parent.mkdir(exist_ok=True)
    attributes.write_text("* -diff\n")
    try:
        return diff_of(repo, files)
    finally:
        attributes.unlink()


def _graded(result: dict) -> None:
    assert result["status"] not in NO_VERDICT, {
        k: result.get(k) for k in ("status", "error_code", "error")}
    assert result.get("error_code") != "internal_error"


class HealthPoller:
    """Polls ``/health`` in a thread while a grading runs: every poll must be answered."""

    def __init__(self, url: str) -> None:
        self.url, self.answers, self.failures = url, 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                status = requests.get(self.url + "/health", timeout=60).status_code
                self.answers += 1
                if status != 200:
                    self.failures.append(status)
            except requests.RequestException as exc:
                self.failures.append(repr(exc))
            self._stop.wait(0.05)


@pytest.mark.parametrize("case", sorted(AGENT_FILES))
def test_agent_config_bytes_are_graded_and_excluded(executor, demo_task, case):
    path, content = AGENT_FILES[case]
    patch = binary_diff(Path(demo_task.repo), {path: content})
    with HealthPoller(executor.url) as health:
        result = executor.submit(demo_task.request(case, patch)).json()
    _graded(result)
    assert result["status"] == "unresolved"  # nothing fixed: the bug is still there
    assert health.answers > 0 and health.failures == []
    if "/" not in path:  # the agent's version of a test-config file never reached the tests
        assert path in result["excluded_files"]


@pytest.mark.parametrize("case", ["huge-pyproject", "nested-pyproject", "backtracking-pyproject"])
def test_agent_config_bytes_with_the_fix_still_resolve(executor, demo_task, case):
    path, content = AGENT_FILES[case]
    fix = binary_diff(Path(demo_task.repo), {path: content, **{
        name: text.encode() for name, text in FIXED_FILES.items()}})
    result = executor.submit(demo_task.request(case, fix)).json()
    assert result["status"] == "resolved", {k: result.get(k) for k in ("status", "error")}
    assert path in result["excluded_files"]


@pytest.mark.parametrize("case", ["huge-pyproject", "nested-pyproject", "backtracking-setup-cfg"])
def test_a_session_that_writes_such_bytes_finishes_with_a_verdict(executor, demo_task, case):
    path, content = AGENT_FILES[case]
    started = executor.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit,
        "env": FAST_PYTEST_ENV}).json()
    session = started["session_id"]
    written = executor.put(f"/session/{session}/file", params={"path": path}, data=content)
    assert written.status_code == 200, written.text
    with HealthPoller(executor.url) as health:
        finished = executor.post(f"/session/{session}/finish", json={
            "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
            "pass_to_pass": demo_task.pass_to_pass}).json()
    assert "result" in finished, finished
    _graded(finished["result"])
    assert finished["result"]["status"] == "unresolved"
    assert health.failures == []


_OLD_HEADER = r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$"  # cubic: short lines only


@pytest.mark.parametrize("line", [
    "[tool.pytest]", "  [ tool.pytest ]  # comment", "[[tool.pytest.x]]", "[a]]", "[]", "[ ]",
    "[a] b", "[a]#c", "x = [1]", "[[a]", "[a", "\t[tool:pytest]\t", "[ a b ]", "[a]] # x",
])
def test_the_header_reader_reads_what_the_old_regex_read(line):
    import re

    match = re.match(_OLD_HEADER, line)
    assert testconfig.table_header(line) == (match.group(1) if match else None)


@pytest.mark.parametrize("line, name", [
    ("[" + " " * 2000 + "x" * 2000 + " " * 2000, None),
    ("[" + " " * 20_000 + "x" * 20_000 + " " * 20_000 + "]", "x" * 20_000),
    ("[[" + " \t" * 30_000 + "]", " \t" * 30_000),
], ids=["issue-line", "closed", "whitespace"])
def test_the_header_reader_takes_lines_that_made_the_old_regex_backtrack(line, name):
    assert testconfig.table_header(line) == name


def test_a_megabyte_line_of_blanks_in_setup_cfg_is_read_in_one_pass():
    """Just under the size cap, in a subprocess with a generous limit: the old option regex
    took hours on it (quadratic); one pass takes milliseconds."""
    import subprocess
    import sys

    script = ("from task_executor.grading import testconfig as t\n"
              "line = '[tool:pytest]\\n' + ' ' * (t.MAX_SECTIONED_BYTES - 100) + 'x\\n'\n"
              "print(t.restore_test_sections('setup.cfg', '[tool:pytest]\\na = 1\\n', line)[1])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


def test_every_sectioned_reader_refuses_what_it_cannot_take_without_raising():
    for name in sorted(testconfig.SECTIONED_FILES):
        base = "[tool:pytest]\na = 1\n" if name == "setup.cfg" else "[tool.pytest]\na = 1\n"
        for patched in [HUGE.decode("latin-1"), NESTED.decode(), BACKTRACKING.decode() * 50,
                        "\0\udcff", "[" * 10_000]:
            text, changed = testconfig.restore_test_sections(name, base, patched)
            # Changed, and what came back has the base's test configuration: restoring it
            # again finds nothing to change.
            assert changed
            assert testconfig.restore_test_sections(name, base, text) == (text, False)


# -- the property: no patch the agent can send turns its grading into "no verdict" ----------

_NAMES = st.sampled_from(["pyproject.toml", "setup.cfg", "sub/pyproject.toml", "tox.ini",
                          "conftest.py", "calc/__init__.py", "weird name\t.py", "é/ß.toml"])
_CONTENT = st.one_of(
    st.binary(max_size=4096),
    st.text(max_size=2048).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 20_000).map(lambda n: b"x = " + b"[" * n + b"]" * n + b"\n"),
    st.integers(1, 20_000).map(lambda n: b"[" + b" " * n + b"x" * n + b" " * n + b"\n"),
    st.integers(1, 3).map(lambda n: b"\0" * (n * 1024 * 1024)),
    st.sampled_from([b"[tool.pytest.ini_options]\n", b"[tool:pytest]\naddopts=-x\n", b"\xff\xfe"]),
)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=st.dictionaries(_NAMES, _CONTENT, min_size=1, max_size=3))
def test_no_agent_patch_gives_no_verdict(executor, demo_task, files):
    patch = binary_diff(Path(demo_task.repo), files)
    _graded(executor.submit(demo_task.request("property", patch)).json())
