"""Tiny task images for tests: unpacked root filesystems made from the host's own /usr.

A hard-linked copy of /usr (the merged-/usr symlinks beside it), an etc with what bash, git and
the dynamic linker read, and a marker file with a token the host does not have.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ETC_FILES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d")
MARKER = "etc/dockyard-image"


def make_image_root(path: Path) -> str:
    """An image root at ``path`` (on the same filesystem as /usr for hard links, else copied);
    returns the token in its ``/etc/dockyard-image``."""
    if not Path("/usr/bin/bash").exists() or Path("/usr").is_symlink():
        pytest.skip("needs a merged-/usr host to copy its /usr as an image")
    path.mkdir(parents=True)
    path.chmod(0o755)
    try:
        subprocess.run(["cp", "-al", "/usr", str(path / "usr")], check=True,
                       capture_output=True)
    except subprocess.CalledProcessError as exc:  # another filesystem: a real copy instead
        shutil.rmtree(path / "usr", ignore_errors=True)
        if b"cross-device" not in exc.stderr.lower() and b"invalid" not in exc.stderr.lower():
            raise
        subprocess.run(["cp", "-a", "/usr", str(path / "usr")], check=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if (Path("/") / link).is_symlink():
            (path / link).symlink_to(f"usr/{link}")
    (path / "etc").mkdir()
    (path / "root").mkdir(mode=0o700)  # as a container image's root home
    (path / "root/.image-profile").write_text("from the image\n")
    for name in ETC_FILES:
        source = Path("/etc") / name
        if source.is_dir():
            shutil.copytree(source, path / "etc" / name, symlinks=True)
        elif source.exists():
            shutil.copy2(source, path / "etc" / name)
    token = secrets.token_hex(8)
    (path / MARKER).write_text(token + "\n")
    return token


IMAGE_A = "registry.example/dockyard/task-a:1"
IMAGE_B = "registry.example/dockyard/task-b:1"


@pytest.fixture(scope="session")
def task_images() -> Iterator[tuple[Path, dict[str, str]]]:
    """An image directory (the local provider's naming rule) with two images, made once per
    test session: each is a hard-linked copy of /usr, seconds to make and to remove."""
    from sandbox_client.pool import image_root

    directory = Path(tempfile.mkdtemp(prefix="dockyard-images-", dir="/var/tmp"))
    directory.chmod(0o755)
    try:
        yield directory, {ref: make_image_root(image_root(directory, ref))
                          for ref in (IMAGE_A, IMAGE_B)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
