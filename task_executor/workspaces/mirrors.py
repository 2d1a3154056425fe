"""Per-repository bare mirrors under TASK_BASE_DIR: clone once, fetch a missing commit on demand.

Every working tree is made from a local mirror, so a task never waits on the network for objects
it already has. Two tasks that need the same repository at once take the same lock: one clones
or fetches, the other finds the commit there. Mirrors are a cache with a disk budget: beyond it
the least recently used are removed, never one a live workspace holds (``pin``) nor one used in
the last minute.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from task_executor.errors import RepoError

from .fsutil import disk_usage
from .gitcmd import GitFailed, git

log = logging.getLogger(__name__)

_COMMITISH = re.compile(r"^[0-9A-Za-z._/\-^~]{1,200}$")
_REMOTE = re.compile(r"^(https?|git|ssh|file)://|^[\w.\-]+@[\w.\-]+:")


def is_remote(repo: str) -> bool:
    return bool(_REMOTE.match(repo))


class MirrorCache:
    """Bare mirrors keyed by the repository's URL or absolute path."""

    def __init__(self, root: Path, budget_bytes: int | None = None) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self._pins: dict[Path, int] = {}
        self._sizes: dict[Path, int] = {}
        self._last_used: dict[Path, float] = {}
        for mirror in self.root.glob("*.git"):
            self._sizes[mirror] = disk_usage(mirror)
            self._last_used[mirror] = mirror.stat().st_mtime - time.time() + time.monotonic()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # A full commit id, once found in a mirror, stays there: later requests skip git and the
        # lock entirely (the hot path of every workspace create).
        self._known: dict[tuple[str, str], tuple[Path, str]] = {}

    def source_of(self, repo: str) -> str:
        """Normalize the request's repo into something git can clone; RepoError if it cannot."""
        if is_remote(repo):
            return repo
        path = Path(repo).expanduser()
        if not path.is_absolute():
            raise RepoError(f"repo {repo!r} must be a git URL or an absolute local path")
        if not path.exists():
            raise RepoError(f"repo path {repo} does not exist")
        return str(path.resolve())

    def mirror_path(self, source: str) -> Path:
        digest = hashlib.sha256(source.encode()).hexdigest()[:20]
        name = re.sub(r"[^\w.\-]", "_", source.rstrip("/").rsplit("/", 1)[-1])[:40]
        return self.root / f"{name}-{digest}.git"

    def resolve(self, repo: str, commit: str) -> tuple[Path, str]:
        """Ensure the mirror holds ``commit``; return (mirror path, full commit sha)."""
        if not _COMMITISH.match(commit) or commit.startswith("-"):
            raise RepoError(
                f"base_commit {commit!r} is not a valid revision", code="unknown_commit"
            )
        source = self.source_of(repo)
        known = self._known.get((source, commit))
        if known is not None and (known[0] / "HEAD").exists():
            self._last_used[known[0]] = time.monotonic()
            return known
        mirror = self.mirror_path(source)
        grew = False
        with self._locked(mirror):
            self._last_used[mirror] = time.monotonic()
            if not (mirror / "HEAD").exists():
                self._clone(source, mirror)
                grew = True
            sha = self._rev_parse(mirror, commit)
            if sha is None:
                self._fetch(mirror, commit)
                grew = True
                sha = self._rev_parse(mirror, commit)
            if grew:
                self._sizes[mirror] = disk_usage(mirror)
            if sha is None:
                raise RepoError(f"commit {commit} not found in {repo}", code="unknown_commit")
        if grew:
            self.evict()
        if sha == commit.lower():
            self._known[(source, commit)] = (mirror, sha)
        return mirror, sha

    def pin(self, mirror: Path) -> None:
        """A workspace made from ``mirror`` lives: keep it."""
        with self._locks_guard:
            self._pins[mirror] = self._pins.get(mirror, 0) + 1

    def unpin(self, mirror: Path) -> None:
        with self._locks_guard:
            self._pins[mirror] = self._pins.get(mirror, 1) - 1

    def evict(self, recent_s: float = 60.0) -> list[Path]:
        """Remove least recently used mirrors until the cache fits its budget."""
        if self.budget_bytes is None:
            return []
        removed = []
        now = time.monotonic()
        with self._locks_guard:
            total = sum(self._sizes.values())
            candidates = sorted(self._sizes, key=lambda m: self._last_used.get(m, 0.0))
        for mirror in candidates:
            if total <= self.budget_bytes:
                break
            if self._pins.get(mirror, 0) > 0 or now - self._last_used.get(mirror, 0.0) < recent_s:
                continue
            with self._locked(mirror):
                if self._pins.get(mirror, 0) > 0:
                    continue
                shutil.rmtree(mirror, ignore_errors=True)
                total -= self._sizes.pop(mirror, 0)
                self._last_used.pop(mirror, None)
                self._known = {k: v for k, v in self._known.items() if v[0] != mirror}
            removed.append(mirror)
            log.info("mirror %s evicted (cache over its budget)", mirror.name)
        return removed

    def stats(self) -> dict[str, int]:
        return {"mirrors": len(self._sizes), "disk_bytes": sum(self._sizes.values())}

    @contextmanager
    def _locked(self, mirror: Path) -> Iterator[None]:
        # A thread lock serializes this process; the file lock also keeps several executors that
        # share one base directory from cloning into the same mirror at once.
        with self._locks_guard:
            lock = self._locks.setdefault(str(mirror), threading.Lock())
        with lock:
            lock_file = mirror.with_suffix(".lock")
            with open(lock_file, "w") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def _clone(self, source: str, mirror: Path) -> None:
        partial = mirror.with_name(mirror.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log.info("cloning mirror of %s", source)
        try:
            git(["clone", "--mirror", "--quiet", source, str(partial)])
        except GitFailed as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise RepoError(f"cannot clone {source}: {exc.stderr.strip()[:500]}") from exc
        # Rename last, so a crash mid-clone never leaves a mirror that looks complete.
        os.replace(partial, mirror)

    def _fetch(self, mirror: Path, commit: str) -> None:
        log.info("fetching %s into %s", commit, mirror.name)
        git(["fetch", "--quiet", "--prune", "origin"], cwd=mirror, check=False)
        if re.fullmatch(r"[0-9a-f]{40}", commit):
            git(["fetch", "--quiet", "origin", commit], cwd=mirror, check=False)

    @staticmethod
    def _rev_parse(mirror: Path, commit: str) -> str | None:
        proc = git(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}"],
            cwd=mirror,
            check=False,
        )
        if proc.returncode != 0:
            return None
        return proc.stdout.decode().strip()
