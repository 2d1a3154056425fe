"""Copy-on-write runtime directories: the image's interpreter and environments, per workspace.

Share the runtime, isolate only mutable state: code under test sees ``/usr/local``, ``/opt`` (a
conda env, a SWE-bench task image's interpreter) as they are, and a ``pip install`` into them
lands in that workspace's own upper layer, invisible to other workspaces, the template and the
host. The host directory is bound once, read-only and idmapped (its root-owned files owned by the
sandbox uid, so that root inside may write them copy-on-write); each workspace mounts an overlay
over it with its upper layer in the workspace's disk quota. A template's setup gets the same, and
keeps its upper layer as a layer every workspace of the template stacks on (an environment
installed by setup is there for every workspace, copied by none).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from task_executor.sandbox.isolation import Bind
from task_executor.sandbox.mounts import bind_idmapped, mount_overlay, unmount

log = logging.getLogger(__name__)


def _slug(directory: str) -> str:
    return directory.strip("/").replace("/", "-") or "root"


class RuntimeLayers:
    """The runtime directories shown copy-on-write, with one idmapped base bind each."""

    def __init__(self, root: Path, directories: tuple[str, ...], uid: int,
                 source_root: Path = Path("/")) -> None:
        """``source_root``: where the directories are taken from (a task image's root shows
        its own ``/usr/local``, not the host's)."""
        self.root = root
        self.directories: list[str] = []
        self._bases: dict[str, Path] = {}
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o711)
        for directory in directories:
            source = source_root / directory.lstrip("/")
            # An image's symlink would be followed on the host, out of the image.
            if (source_root != Path("/") and source.is_symlink()) or not source.is_dir():
                continue
            base = root / _slug(directory)
            unmount(base)  # left by a crashed predecessor
            base.mkdir(exist_ok=True)
            try:
                bind_idmapped(source, base, uid)
            except OSError as exc:
                log.warning("runtime directory %s stays read-only: %s", directory, exc)
                continue
            self.directories.append(directory)
            self._bases[directory] = base

    def mount(self, holder: Path, rw: Path, below: Path | None = None) -> tuple[Bind, ...]:
        """Overlays of every runtime directory for one workspace (or template setup): upper
        layers under ``rw``, mount points under ``holder``; ``below`` holds a template's layers
        to stack between the host's directory and the workspace's upper."""
        binds = []
        for directory in self.directories:
            slug = _slug(directory)
            upper, work = rw / "runtime" / slug / "upper", rw / "runtime" / slug / "work"
            merged = holder / "runtime-mnt" / slug
            for path in (upper, work, merged):
                path.mkdir(parents=True, exist_ok=True)
            os.chown(upper, *_owner_of(self._bases[directory]))
            lowers = [self._bases[directory]]
            template_layer = below / "runtime" / slug / "upper" if below is not None else None
            if template_layer is not None and template_layer.is_dir():
                lowers.insert(0, template_layer)
            mount_overlay(lowers, upper, work, merged)
            binds.append(Bind(merged, directory))
        return tuple(binds)

    def unmount(self, holder: Path) -> None:
        for directory in self.directories:
            unmount(holder / "runtime-mnt" / _slug(directory))


def _owner_of(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, info.st_gid
