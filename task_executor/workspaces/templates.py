"""Templates: a repository at a commit with its setup done, prepared once and shared read-only.

A template is keyed by (repository, commit, setup commands, environment), hashed by the protocol's
``template_key`` from the mirror cache's source and the full commit sha, so the key is the one a
client routes by whenever the request names a full sha. The first request for a key builds it;
concurrent requests for the same key wait for that one build instead of starting their own.
``last_acquire_hit`` tells the caller whether its acquire found the template or built it.
Workspaces hold their template (``acquire`` / ``release``), and eviction (least recently used,
under a disk budget) never removes a template that is held.

Setup runs with the template mounted at the fixed path (in fast mode), so absolute paths that
setup bakes in (editable installs, virtualenv scripts) are the paths every workspace sees later.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_client.protocol import template_key
from task_executor.errors import ExecutorError

from .artifacts import setup_artifacts
from .fsutil import disk_usage, remove_tree
from .gitcmd import git
from .mirrors import MirrorCache

log = logging.getLogger(__name__)

SetupRunner = Callable[[Path, list[str], dict[str, str]], None]
"""Prepares a fresh tree and runs setup commands in it (raises on failure)."""


@dataclass
class Template:
    key: str
    root: Path
    commit: str
    mirror: Path
    size_bytes: int = 0
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    artifacts: list[str] = field(default_factory=list)
    """Paths setup created or changed (see capture.setup_artifacts)."""
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def tree(self) -> Path:
        return self.root / "tree"


class TemplateCache:
    """Templates under ``root``, built with ``run_setup``, evicted under ``budget_bytes``."""

    def __init__(
        self, root: Path, mirrors: MirrorCache, run_setup: SetupRunner, budget_bytes: int
    ) -> None:
        self.root = root
        self.mirrors = mirrors
        self.run_setup = run_setup
        self.budget_bytes = budget_bytes
        self._templates: dict[str, Template] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.builds = 0
        self._acquired = threading.local()
        root.mkdir(parents=True, exist_ok=True)
        # Templates from an earlier run are not trusted: their build may have been cut short.
        for leftover in root.iterdir():
            remove_tree(leftover)

    def acquire(self, repo: str, commit: str, setup: list[str], env: dict[str, str]) -> Template:
        self._acquired.hit = None
        mirror, sha = self.mirrors.resolve(repo, commit)
        # The source (one mirror per source) and the sha the mirror holds, not the request's
        # spelling: two names for one commit share a template, a moved branch gets a new one.
        key = template_key(self.mirrors.source_of(repo), sha, setup, env)
        with self._lock:
            template = self._templates.get(key)
            builder = template is None or template.error is not None
            if builder:
                template = Template(key=key, root=self.root / key, commit=sha, mirror=mirror)
                self._templates[key] = template
                self.misses += 1
            else:
                self.hits += 1
            assert template is not None
            template.leases += 1
        self._acquired.hit = not builder
        if builder:
            self._build(template, setup, env)
        else:
            template.ready.wait()
        if template.error is not None:
            self.release(template)
            raise template.error
        template.last_used = time.monotonic()
        return template

    def last_acquire_hit(self) -> bool | None:
        """Whether this thread's latest ``acquire`` reused its template (True) or built it
        (False); None before any. Per thread, because ``acquire`` returns the shared template and
        a workspace is made in the thread that asked for it."""
        return getattr(self._acquired, "hit", None)

    def release(self, template: Template) -> None:
        with self._lock:
            template.leases -= 1
            template.last_used = time.monotonic()
        self.evict()

    def _build(self, template: Template, setup: list[str], env: dict[str, str]) -> None:
        started = time.monotonic()
        try:
            remove_tree(template.root)
            template.root.mkdir(parents=True)
            # Hard links, not alternates: the template's git must work where the mirror is
            # hidden (code under test never sees the executor's base directory).
            git(["clone", "--quiet", "--local", "--no-checkout", str(template.mirror),
                 str(template.tree)])
            git(["checkout", "--quiet", "--detach", template.commit], cwd=template.tree)
            # Called even without setup commands: it also hands the tree to the sandbox's uid.
            self.run_setup(template.tree, setup, env)
            if setup:
                template.artifacts = setup_artifacts(template.tree, template.mirror,
                                                     template.commit)
            template.size_bytes = disk_usage(template.root)
            self.builds += 1
            log.info("template %s built in %.2fs (%d bytes)", template.key,
                     time.monotonic() - started, template.size_bytes)
        except BaseException as exc:
            template.error = exc
            remove_tree(template.root)
            with self._lock:
                # Forget a failed build so that a later request tries again.
                if self._templates.get(template.key) is template:
                    del self._templates[template.key]
            # A task's own failure (4xx: a failing setup command) is the caller's to report.
            if not (isinstance(exc, ExecutorError) and exc.http_status < 500):
                log.exception("template %s failed to build", template.key)
        finally:
            template.ready.set()

    def evict(self) -> list[str]:
        """Remove least recently used idle templates until the cache fits its budget."""
        removed = []
        with self._lock:
            ready = [t for t in self._templates.values() if t.ready.is_set() and not t.error]
            total = sum(t.size_bytes for t in ready)
            for template in sorted(ready, key=lambda t: t.last_used):
                if total <= self.budget_bytes:
                    break
                if template.leases > 0:
                    continue
                del self._templates[template.key]
                total -= template.size_bytes
                removed.append(template)
        for template in removed:
            shutil.rmtree(template.root, ignore_errors=True)
            log.info("template %s evicted", template.key)
        return [t.key for t in removed]

    def stats(self) -> dict[str, int]:
        with self._lock:
            ready = [t for t in self._templates.values() if t.ready.is_set() and not t.error]
            return {
                "hits": self.hits,
                "misses": self.misses,
                "builds": self.builds,
                "templates": len(ready),
                "disk_bytes": sum(t.size_bytes for t in ready),
                "leased": sum(1 for t in ready if t.leases > 0),
            }
