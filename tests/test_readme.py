"""The README's two commands stay true: the demo grades as promised, CI runs the test command."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_first_screen_names_the_commands_ci_runs():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:25])
    test_command = "pip install -e '.[test,k8s]' && python -m pytest -q"
    assert "pip install -e . && scripts/demo.sh" in first_screen
    assert test_command in first_screen
    assert test_command in (ROOT / ".ci/run").read_text()


def test_demo_script_grades_gold_resolved_and_empty_unresolved():
    env = {**os.environ, "API_PORT": str(_free_port())}
    env.pop("API_TOKEN", None)
    proc = subprocess.run(
        [str(ROOT / "scripts/demo.sh"), "--exit"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo-gold: status=resolved resolved=True fail_to_pass passed=3/3" in proc.stdout
    assert "demo-empty: status=unresolved resolved=False fail_to_pass passed=0/3" in proc.stdout
    work = proc.stdout.split("request bodies: ", 1)[1].split()[0]
    assert not Path(work).exists()
