"""The README's two commands stay true: the first, verbatim, in a fresh virtualenv without the test
extra on a machine whose python3 has no pytest; CI runs the second."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_COMMAND = "pip install -e . && scripts/demo.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_first_screen_names_the_commands_ci_runs():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:25])
    test_command = "pip install -e '.[test,k8s]' && python -m pytest -q -n 2 --dist loadfile"
    assert FIRST_COMMAND in first_screen
    assert test_command in first_screen
    assert test_command in (ROOT / ".ci/run").read_text()


def _fresh_clone(target: Path) -> Path:
    """The project's files as a fresh clone has them (tracked and new, not ignored): no
    egg-info, caches or venv of this checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _python_without_pytest(directory: Path) -> str:
    """A task PATH whose python3 (and python) is the machine's interpreter without its
    site-packages: what a fresh machine's python3 is when nobody installed pytest for it (here
    apt's python3-pytest is installed for /usr/bin/python3, which graded code would otherwise
    see). ``directory`` must be visible inside the sandbox (its /tmp is private)."""
    machine_python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    assert machine_python, "no python3 on the machine's PATH"
    for name in ("python3", "python"):
        wrapper = directory / name
        wrapper.write_text(f'#!/bin/sh\nexec {machine_python} -S "$@"\n')
        wrapper.chmod(0o755)
    return f"{directory}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_first_command_in_a_fresh_virtualenv_without_pytest_anywhere(
    tmp_path: Path, shared_dir: Path
) -> None:
    """``pip install -e . && scripts/demo.sh`` from a fresh clone into a fresh venv (no extras):
    the demo's own setup builds its test environment, so it grades as promised although neither
    the venv nor the task's python3 has pytest; then ``--exit`` leaves no file behind."""
    clone = _fresh_clone(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    task_path = _python_without_pytest(shared_dir)
    probe = subprocess.run(["python3", "-c", "import pytest"], env={"PATH": task_path},
                           capture_output=True, text=True, check=False)
    assert "No module named 'pytest'" in probe.stderr, "the simulated python3 has pytest"

    this_venv = str(Path(sys.prefix) / "bin")
    path = [str(venv / "bin")] + [
        p for p in os.environ.get("PATH", "").split(":") if p and p != this_venv
    ]
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        "PATH": ":".join(path),
        "VIRTUAL_ENV": str(venv),  # as `source venv/bin/activate` leaves it
        "API_PORT": str(_free_port()),
        "DOCKYARD_TASK_PATH": task_path,
    }
    env.pop("API_TOKEN", None)
    proc = subprocess.run(
        ["bash", "-c", f"{FIRST_COMMAND} --exit"], cwd=clone, env=env,
        capture_output=True, text=True, timeout=900, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "demo-gold: status=resolved resolved=True fail_to_pass passed=3/3" in proc.stdout, out
    assert "demo-empty: status=unresolved resolved=False fail_to_pass passed=0/3" in proc.stdout
    work = proc.stdout.split("request bodies: ", 1)[1].split()[0]
    assert not Path(work).exists()
    # The venv got the package and no test runner: the demo did not borrow one from it.
    imports = subprocess.run(
        [str(venv / "bin/python"), "-c", "import task_executor, sandbox_client, pytest"],
        capture_output=True, text=True, check=False,
    )
    assert "No module named 'pytest'" in imports.stderr, imports.stderr


def test_demo_script_exits_1_showing_why_when_a_verdict_is_not_the_promised_one(
    shared_dir: Path,
) -> None:
    """A task python3 that cannot build the venv: both gradings end in execution_error, and the
    script says so with error_code and error, exits 1 and keeps its files to look at."""
    broken = shared_dir / "python3"
    broken.write_text("#!/bin/sh\necho 'python3: simulated broken interpreter' >&2\nexit 1\n")
    broken.chmod(0o755)
    env = {
        **os.environ,
        "API_PORT": str(_free_port()),
        "DOCKYARD_TASK_PATH": f"{shared_dir}:/usr/local/bin:/usr/bin:/bin",
    }
    env.pop("API_TOKEN", None)
    proc = subprocess.run(
        [str(ROOT / "scripts/demo.sh"), "--exit"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    work = Path(proc.stdout.split("request bodies: ", 1)[1].split()[0])
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "demo-gold: status=execution_error" in proc.stdout
        assert "expected status=resolved, got status=execution_error error_code=setup_failed" \
            in proc.stderr
        assert "simulated broken interpreter" in proc.stderr
        assert f"demo: FAILED: a verdict is not the one promised (see above); request bodies " \
            f"and executor log kept in {work}" in proc.stderr
        assert (work / "executor" / "task_executor.log").is_file()
    finally:
        from task_executor.service.lifecycle import unmount_under

        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def test_readme_examples_import_what_the_package_exports() -> None:
    """Every ``from sandbox_client import ...`` in the README's Python examples names something the
    package exports, and the trainer examples spell the seed's models (TaskSpec, ...)."""
    import re

    import sandbox_client

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    imported = {
        name.strip()
        for block in blocks
        for names in re.findall(r"^from sandbox_client import (.+)$", block, flags=re.M)
        for name in names.split(",")
    }
    assert {"TaskSpec", "TaskResult", "SessionStartSpec", "ExecResult", "FinishResult"} <= imported
    assert sorted(n for n in imported if n not in sandbox_client.__all__) == []


def test_readme_specs_example_is_a_valid_specs_file(tmp_path: Path) -> None:
    """The ``--specs`` example in the README loads, and fills a SWE-bench instance with it."""
    import re

    from sandbox_client.cli.specs import RepoSpecs

    text = (ROOT / "README.md").read_text()
    section = text.split("**`--specs FILE`**", 1)[1]
    example = re.search(r"```json\n(.*?)```", section, flags=re.S)
    assert example is not None
    (tmp_path / "specs.json").write_text(example.group(1))
    specs = RepoSpecs.load(tmp_path / "specs.json")
    patch = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n" \
        "+++ b/tests/test_x.py\n"
    filled = specs.fill({"repo": "psf/requests", "version": "2.0", "test_patch": patch})
    assert filled["test_command"].endswith("-p no:cacheprovider tests/test_x.py")
    assert "'pytest<4'" in filled["setup"][1] and filled["env"] == {"PIP_NO_CACHE_DIR": "1"}
