"""Workspaces: a private, writable tree of a repository at a commit, for one task or session.

Three modes, chosen once at start from what the kernel allows (``isolation.detect``):

``overlay``   an overlayfs upper directory over a prepared template, seen by code under test at the
              fixed path in a private mount namespace. Create, reset and destroy cost a mount, an
              unmount and the removal of what the task changed -- not the repository's size.
``copy``      (mount namespaces but no overlay) a full copy of the template (reflinked where the
              filesystem can), still at the fixed path.
``git-clone`` (no namespaces, as in a default Kubernetes pod) a ``git clone --shared`` and checkout
              per workspace at its own path; setup runs in each workspace, because absolute paths
              baked into a shared template would point at the template instead of the task's tree.

All three give the same verdicts; only speed and isolation differ, and ``/health`` says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_client.protocol import SandboxReport
from task_executor.errors import Conflict, ExecutorError, Unavailable
from task_executor.sandbox.capabilities import Capabilities
from task_executor.sandbox.cgroups import Group, Groups, kill_groups, remove_emptied
from task_executor.sandbox.command import run_command
from task_executor.sandbox.isolation import Bind, Sandbox
from task_executor.sandbox.mounts import bind, mount_overlay, mount_tmpfs, unmount
from task_executor.sandbox.namespaces import Launcher, LaunchNamespaces, MountNamespace

from .artifacts import setup_artifacts
from .fsutil import (
    CopyFailed,
    copy_over,
    copy_tree,
    remove_small_tree,
    remove_tree,
    remove_trees,
    tree_bytes,
)
from .gitcmd import git
from .mirrors import MirrorCache
from .report import sandbox_report
from .runtime import RuntimeLayers
from .templates import Template, TemplateCache

log = logging.getLogger(__name__)

BUCKET_PREFIX = "holders-"
"""Workspaces live in ``<root>/holders-<2 hex digits>/ws-<16 hex digits>`` where mounts are
allowed, each bucket a mount of its own (see ``WorkspaceFactory._holder_parent``)."""

_TEARDOWN_WORKERS = 8
"""Threads that let launch namespaces go at once in ``destroy_all``."""

EnvBuilder = Callable[[str, dict[str, str]], dict[str, str]]
"""(temporary directory as code under test sees it, task env) -> its full environment."""


class SetupFailed(ExecutorError):
    """A setup command failed: the task's environment could not be prepared (not the patch)."""

    code = "setup_failed"
    http_status = 400


class SnapshotFailed(Conflict):
    """The tree is in a state no copy can be made of (nested past PATH_MAX): the agent's doing,
    told to it (409), with nothing left on the host."""

    code = "snapshot_failed"


@dataclass(frozen=True)
class Snapshot:
    """A read-only capture of a workspace: its changes (overlay mode) or its whole tree."""

    path: Path
    size_bytes: int


@dataclass
class Workspace:
    """A tree at ``base_commit``; everything it owns lives under ``root``."""

    path: Path
    """The tree as the executor sees it (files API, patching, diff capture)."""
    root: Path
    base_commit: str
    mirror: Path
    visible_path: str
    """Where code under test sees the tree (the fixed path in namespace modes)."""
    setup: list[str]
    env: dict[str, str]
    factory: WorkspaceFactory
    template: Template | None = None
    template_hit: bool | None = None
    """True: made from a template that was ready (or being built by another request); False:
    this workspace's request built it; None: no template (git-clone mode)."""
    layers: list[Path] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    """Paths setup created or changed: environment, never part of a captured patch."""
    setup_s: float = 0.0
    """Seconds this workspace's own setup took (0 when a prepared template carried it)."""
    group: Group | None = None
    """The workspace's cgroups (process and memory limits), where the kernel gives them."""
    runtime_binds: tuple[Bind, ...] = ()
    """Its copy-on-write views of the runtime directories."""
    namespace: MountNamespace | None = None
    """The mount namespace its sandboxes start from (see ``sandbox.namespaces``)."""
    destroyed: bool = False

    @property
    def rw(self) -> Path:
        """Everything the workspace writes (a size-limited tmpfs where mounts are allowed)."""
        return self.root / "rw"

    @property
    def tmp(self) -> Path:
        """Private temporary directory (seen as /tmp by code under test in namespace modes)."""
        return self.rw / "tmp"

    @property
    def visible_tmp(self) -> str:
        return self.factory.sandbox.visible_tmp(self.tmp)

    def sandbox_env(self, extra: dict[str, str]) -> dict[str, str]:
        """The environment of code under test in this workspace."""
        return self.factory.env_builder(self.visible_tmp, extra)

    def launcher(self, deny_network: bool, binds: tuple[Bind, ...] = (),
                 chdir: str | None = None, group: Group | None = None) -> Launcher:
        """How to run a command in this workspace's sandbox, in its cgroup (or ``group``)."""
        return self.factory.sandbox.launcher(
            self.path, self.tmp, deny_network, group=group or self.group,
            binds=(*self.runtime_binds, *binds), args_dir=self.factory.args_dir(self.root),
            namespace=self.namespace,
            chdir=chdir,
        )

    def destroy(self) -> None:
        self.factory.destroy(self)

    def reset(self) -> None:
        self.factory.reset(self)

    def snapshot(self, target: Path) -> Snapshot:
        return self.factory.snapshot(self, target)


def launch_args_root(base_dir: Path, sandbox: Sandbox) -> Path | None:
    """A root-only tmpfs in ``base_dir`` for the option files the launcher writes on every
    workspace's first launch (two files cost 1.25 ms on this disk, 0.1 ms there), or None where
    the sandbox makes no tmpfs. Mount it before the launch namespaces are made: they copy it
    then. It goes with the rest of the base directory's mounts."""
    if not (sandbox.active and sandbox.capabilities.tmpfs_quota):
        return None
    root = base_dir / "launch-args"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        if not os.path.ismount(root):
            mount_tmpfs(root, 256 << 20, mode=0o700)
    except OSError as exc:
        log.warning("bubblewrap option files stay on the disk: %s", exc)
        return None
    return root


class WorkspaceFactory:
    """Makes workspaces under ``root`` in the best mode the capabilities allow."""

    def __init__(
        self,
        root: Path,
        mirrors: MirrorCache,
        templates: TemplateCache | None,
        sandbox: Sandbox,
        env_builder: EnvBuilder,
        setup_timeout: float,
        groups: Groups | None = None,
        runtime: RuntimeLayers | None = None,
        namespaces: LaunchNamespaces | None = None,
        args_root: Path | None = None,
    ) -> None:
        self.root = root
        self.mirrors = mirrors
        self.templates = templates
        self.sandbox = sandbox
        self.env_builder = env_builder
        self.setup_timeout = setup_timeout
        self.groups = groups
        self.runtime = runtime
        self.namespaces = namespaces
        self.root.mkdir(parents=True, exist_ok=True)
        # The sandbox uid resolves bind sources itself: it may pass through, never list.
        self.root.chmod(0o711)
        self._lock = threading.Lock()
        self._buckets: dict[Path, int] = {}
        """Each bucket in use, and how many holders it has (an empty one goes)."""
        self._retiring: set[Path] = set()
        """Buckets being detached whole (``destroy_all``): no new holder goes there."""
        self.quota_mounts = sandbox.active and self.capabilities.tmpfs_quota
        """Each workspace writes into a tmpfs of its own (its disk quota); a tree that is not an
        overlay (copy and git-clone modes) lives in it too."""
        self.args_root = args_root
        """Where the workspaces' bubblewrap option files go (a directory each, see
        ``launch_args_root``), or None: in their holders, on the disk."""

    def args_dir(self, holder: Path) -> Path:
        """The directory a workspace's option files go to (see ``args_root``)."""
        return holder if self.args_root is None else self.args_root / holder.name

    @property
    def capabilities(self) -> Capabilities:
        return self.sandbox.capabilities

    @property
    def disk_quota(self) -> int | None:
        """Bytes a workspace may write (None: no quota is enforced here)."""
        return self.sandbox.limits.disk_bytes if self.quota_mounts else None

    @property
    def mode(self) -> str:
        caps = self.capabilities
        if caps.mount_namespace and self.sandbox.fixed_path and self.templates is not None:
            return "overlay" if caps.overlay else "copy"
        return "git-clone"

    def sandbox_report(self) -> SandboxReport:
        """What contains code under test here, as ``/health`` reports it."""
        return sandbox_report(
            self.capabilities, self.sandbox.limits,
            self.groups.controllers if self.groups is not None else frozenset(),
            self.runtime.directories if self.runtime is not None else [], self.mode,
            self.groups.cpu_weight if self.groups is not None else None,
            self.sandbox.root,
        )

    # ------------------------------------------------------------------ create / destroy

    def create(
        self,
        repo: str,
        base_commit: str,
        setup: list[str] | None = None,
        env: dict[str, str] | None = None,
        snapshot: Snapshot | None = None,
    ) -> Workspace:
        """A fresh tree (RepoError for an unknown repo or commit, SetupFailed for bad setup).

        With ``snapshot``, the tree starts as the snapshot's state instead of the base (a fork).
        """
        setup, env = list(setup or []), dict(env or {})
        name = uuid.uuid4().hex[:16]
        holder = self._holder_parent(name) / f"ws-{name}"
        holder.mkdir(mode=0o711)
        if self.args_root is not None:
            self.args_dir(holder).mkdir(mode=0o700)
        template = None
        group = None
        namespace = None
        try:
            if self.namespaces is not None:  # first: what is mounted below shows in it
                namespace = self.namespaces.for_holder(holder)
            self._make_rw(holder / "rw")
            if self.groups is not None:
                group = self.groups.create(holder.name)
            if self.mode == "git-clone":
                workspace = self._create_clone(holder, repo, base_commit, setup, env, snapshot,
                                               group, namespace)
            else:
                assert self.templates is not None
                template = self.templates.acquire(repo, base_commit, setup, env)
                workspace = self._from_template(holder, template, setup, env, snapshot, group,
                                                namespace)
                workspace.template_hit = self.templates.last_acquire_hit()
        except BaseException:
            self._release_holder(holder, group, namespace)
            if template is not None and self.templates is not None:
                self.templates.release(template)
            raise
        # Diff capture reads through the mirror (and git-clone trees borrow its objects).
        self.mirrors.pin(workspace.mirror)
        return workspace

    def _holder_parent(self, name: str) -> Path:
        """Where the holder of workspace ``name`` goes: one of 256 buckets, each a mount of its
        own, where holders are mounts (launch namespaces). A bind or an overlay mount walks
        every mount directly below the mount it starts from (the base directory's, where the
        templates are too): with 10,000 holders side by side that cost 304 and 540 µs a mount,
        8 and 74 µs spread over 100 parents (issue 24)."""
        if self.namespaces is None:
            return self.root
        bucket = self.root / f"{BUCKET_PREFIX}{name[:2]}"
        with self._lock:
            if bucket in self._retiring:
                return self.root
            if bucket not in self._buckets:
                bucket.mkdir(mode=0o711, exist_ok=True)
                bind(bucket, bucket)
                self._buckets[bucket] = 0
            self._buckets[bucket] += 1
        return bucket

    def _leave_bucket(self, holder: Path) -> None:
        """``holder`` is gone: its bucket goes too once it holds no other, so nothing is left
        after the last workspace (at density a bucket is seldom empty)."""
        bucket = holder.parent
        with self._lock:
            if bucket not in self._buckets:
                return
            self._buckets[bucket] -= 1
            if self._buckets[bucket] > 0:
                return
            del self._buckets[bucket]
            unmount(bucket)
            with contextlib.suppress(OSError):
                bucket.rmdir()

    def _from_template(
        self,
        holder: Path,
        template: Template,
        setup: list[str],
        env: dict[str, str],
        snapshot: Snapshot | None,
        group: Group | None,
        namespace: MountNamespace | None,
    ) -> Workspace:
        in_tmpfs = self.mode != "overlay" and self.quota_mounts
        path = holder / "rw" / "tree" if in_tmpfs else holder / "merged"
        workspace = Workspace(
            path=path, root=holder, base_commit=template.commit,
            mirror=template.mirror, visible_path=self.sandbox.fixed_path or str(path),
            setup=setup, env=env, factory=self, template=template,
            artifacts=list(template.artifacts), group=group, namespace=namespace,
        )
        if self.mode == "overlay":
            if snapshot is not None:
                layer = holder / "base-layer"
                copy_tree(snapshot.path, layer, self.capabilities.reflink)
                workspace.layers = [layer]
            self._mount(workspace)
        else:
            source = snapshot.path if snapshot is not None else template.tree
            copy_tree(source, workspace.path, self.capabilities.reflink)
        self._mount_runtime(workspace)
        return workspace

    def _make_rw(self, rw: Path) -> None:
        """The workspace's writable space: its overlay upper, /tmp, home and runtime layers, in
        one tmpfs of the disk quota's size where mounts are allowed (ENOSPC past it)."""
        rw.mkdir(mode=0o711)
        quota = self.sandbox.limits.disk_bytes
        if self.quota_mounts:
            # No quota configured: the tmpfs default (half of the RAM) is the ceiling.
            mount_tmpfs(rw, quota, mode=0o711)
        self._make_tmp(rw / "tmp")

    def _make_tmp(self, tmp: Path) -> None:
        """The workspace's /tmp with its home in it, the sandbox uid's (two chowns, not a
        ``chown -R`` process: this runs on every create and reset)."""
        (tmp / "home").mkdir(parents=True)
        tmp.chmod(0o1777)
        self.hand_over(tmp)
        self.hand_over(tmp / "home")

    def _mount(self, workspace: Workspace) -> None:
        assert workspace.template is not None
        for part in ("upper", "work"):
            (workspace.rw / part).mkdir(exist_ok=True)
        workspace.path.mkdir(exist_ok=True)
        # The merged tree's root takes its owner from the upper directory's root.
        self.hand_over(workspace.rw / "upper")
        mount_overlay(
            [*workspace.layers, workspace.template.tree],
            workspace.rw / "upper",
            workspace.rw / "work",
            workspace.path,
        )

    def _mount_runtime(self, workspace: Workspace) -> None:
        if self.runtime is None:
            return
        below = workspace.template.root if workspace.template is not None else None
        workspace.runtime_binds = self.runtime.mount(workspace.root, workspace.rw, below)

    def _unmount_all(self, workspace: Workspace) -> None:
        if self.runtime is not None:
            self.runtime.unmount(workspace.root)
        workspace.runtime_binds = ()
        if self.mode == "overlay":
            unmount(workspace.path)

    def _release_holder(self, holder: Path, group: Group | None,
                        namespace: MountNamespace | None) -> None:
        """Kill what runs in the workspace, unmount everything in it, remove it, and hand its
        group back (last: its tmpfs pages are charged to it until the tmpfs goes)."""
        if group is not None:
            group.kill_all()
        if namespace is not None:
            namespace.close()
            # Bound on itself (os.path.ismount cannot tell: same device): detached with all
            # below it in one call, lazily. Each unmount may wait out an RCU grace period, and
            # five of them one by one made a DELETE's slow tail (15-28 ms each at 3,000 parked
            # sessions).
            unmount(holder)
        else:
            if self.runtime is not None:
                self.runtime.unmount(holder)
            for mounted in (holder / "merged", holder / "rw"):
                if os.path.ismount(mounted):
                    unmount(mounted)
        if not remove_small_tree(holder):
            remove_tree(holder)
        self._remove_args(holder)
        self._leave_bucket(holder)
        if group is not None:
            self.release_group(group)

    def release_group(self, group: Group) -> None:
        """Done with ``group``: to the next workspace, or removed (see ``Groups.release``)."""
        assert self.groups is not None  # (it made the group)
        self.groups.release(group)

    def _remove_args(self, holder: Path) -> None:
        if self.args_root is not None:
            remove_small_tree(self.args_dir(holder))

    def _create_clone(
        self,
        holder: Path,
        repo: str,
        base_commit: str,
        setup: list[str],
        env: dict[str, str],
        snapshot: Snapshot | None,
        group: Group | None,
        namespace: MountNamespace | None,
    ) -> Workspace:
        mirror, sha = self.mirrors.resolve(repo, base_commit)
        path = holder / "rw" / "repo" if self.quota_mounts else holder / "repo"
        if snapshot is not None:
            copy_tree(snapshot.path, path, self.capabilities.reflink)
            self.hand_over(path, recursive=True)
        else:
            self._checkout(mirror, sha, path)
        workspace = Workspace(
            path=path, root=holder, base_commit=sha, mirror=mirror,
            visible_path=self.sandbox.fixed_path if self.sandbox.active and self.sandbox.fixed_path
            else str(path),
            setup=setup, env=env, factory=self, group=group, namespace=namespace,
        )
        self._mount_runtime(workspace)
        if snapshot is None:  # a snapshot was taken after setup
            started = time.monotonic()
            self.run_setup(workspace.path, setup, workspace.sandbox_env(env),
                           launcher=workspace.launcher(False))
            workspace.setup_s = time.monotonic() - started
            if setup:
                workspace.artifacts = setup_artifacts(workspace.path, mirror, sha)
        return workspace

    def _checkout(self, mirror: Path, sha: str, path: Path) -> None:
        """A fresh tree at ``sha`` sharing the mirror's objects, owned by the sandbox's uid."""
        git(["clone", "--quiet", "--shared", "--no-checkout", str(mirror), str(path)])
        git(["checkout", "--quiet", "--detach", sha], cwd=path)
        self.hand_over_tree(path)

    def destroy(self, workspace: Workspace) -> None:
        with self._lock:
            if workspace.destroyed:
                return
            workspace.destroyed = True
        self._release_holder(workspace.root, workspace.group, workspace.namespace)
        self.mirrors.unpin(workspace.mirror)
        if workspace.template is not None and self.templates is not None:
            self.templates.release(workspace.template)

    def kill_processes(self, workspaces: list[Workspace]) -> None:
        """Kill every process of these workspaces at once, through their cgroups."""
        kill_groups([w.group for w in workspaces if w.group is not None])

    def destroy_all(self, workspaces: list[Workspace], keep_trees: bool = False) -> None:
        """Destroy many workspaces at once, at shutdown: one by one, 10,000 took 157 s, each
        unmount paying for the thousands of mounts beside it (issue 24).

        Every process in their cgroups is killed in one pass; each launch namespace is let go
        (with no process left in it, its copies of the mounts go with it, so nothing propagates
        there any more); each bucket, or else each holder, is detached with everything mounted
        below it in one call; then the empty groups, and the trees (in a few ``rm -rf``) unless
        ``keep_trees``: an executor shutting down leaves them to its last sweep of the base
        directory, which stops at the grace period's end (what it leaves, the next start
        removes)."""
        with self._lock:
            mine = [w for w in workspaces if not w.destroyed]
            for workspace in mine:
                workspace.destroyed = True
            # A bucket all of whose holders go now is detached as one: every unmount call
            # waits for the kernel (an RCU grace period), 10,000 of them took 11 s.
            whole = {bucket for bucket, count in Counter(w.root.parent for w in mine).items()
                     if self._buckets.get(bucket) == count}
            for bucket in whole:  # no new holder may go into it meanwhile
                del self._buckets[bucket]
            self._retiring |= whole
        groups = [w.group for w in mine if w.group is not None]
        kill_groups(groups)  # again: a shell closed meanwhile cannot have started anything
        namespaces = [w.namespace for w in mine if w.namespace is not None]
        # Closing a namespace waits for the kernel, not for the CPU: a few threads overlap
        # those waits (``remove_emptied`` does the same for the groups).
        with ThreadPoolExecutor(_TEARDOWN_WORKERS, thread_name_prefix="teardown") as pool:
            list(pool.map(MountNamespace.close, namespaces))
        for bucket in whole:
            unmount(bucket)
        for workspace in mine:
            if workspace.root.parent in whole:
                continue
            if workspace.namespace is not None:
                unmount(workspace.root)  # bound on itself: everything below goes along, lazily
            else:
                self._unmount_all(workspace)
                if os.path.ismount(workspace.rw):
                    unmount(workspace.rw)
        remove_emptied(groups)
        if not keep_trees:  # (an executor shutting down unmounts the option files' tmpfs)
            remove_trees([w.root for w in mine])
            for workspace in mine:
                self._remove_args(workspace.root)
        for bucket in whole:
            with contextlib.suppress(OSError):
                bucket.rmdir()  # a bucket with trees left stays, unmounted
        with self._lock:
            self._retiring -= whole
        for workspace in mine:
            self._leave_bucket(workspace.root)
            self.mirrors.unpin(workspace.mirror)
            if workspace.template is not None and self.templates is not None:
                self.templates.release(workspace.template)

    # ------------------------------------------------------------------ reset / snapshot

    def reset(self, workspace: Workspace) -> None:
        """Back to the base state; in overlay mode this costs what the task changed."""
        if workspace.group is not None:
            workspace.group.kill_all()
        self._unmount_all(workspace)
        for layer in workspace.layers:
            remove_tree(layer)
        workspace.layers = []
        for entry in list(workspace.rw.iterdir()):
            remove_tree(entry)
        self._make_tmp(workspace.tmp)
        if self.mode == "overlay":
            self._mount(workspace)
        else:
            remove_tree(workspace.path)
            if self.mode == "copy":
                assert workspace.template is not None
                copy_tree(workspace.template.tree, workspace.path, self.capabilities.reflink)
            else:
                self._checkout(workspace.mirror, workspace.base_commit, workspace.path)
        self._mount_runtime(workspace)
        if self.mode == "git-clone":
            self.run_setup(workspace.path, workspace.setup, workspace.sandbox_env(workspace.env),
                           launcher=workspace.launcher(False))

    def snapshot(self, workspace: Workspace, target: Path) -> Snapshot:
        """Capture the workspace read-only at ``target``: its changes only, where overlay allows.

        A snapshot that cannot be made leaves nothing at ``target``: SnapshotFailed (409) when
        the tree is why (nested past PATH_MAX), Unavailable (503) when the host disk is full.
        """
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._copy_for_snapshot(workspace, target)
            return Snapshot(path=target, size_bytes=tree_bytes(target))
        except CopyFailed as exc:
            remove_tree(target)
            if exc.out_of_space:
                raise Unavailable(f"the executor's disk is full ({exc.reason}); retry later",
                                  code="snapshot_unavailable", retry_after=30) from None
            raise SnapshotFailed(f"the tree cannot be copied: {exc.reason}") from None
        except BaseException:
            remove_tree(target)
            raise

    def _copy_for_snapshot(self, workspace: Workspace, target: Path) -> None:
        if self.mode != "overlay":
            copy_tree(workspace.path, target, self.capabilities.reflink)
        elif workspace.layers:
            # The fork's lower layers are the source's earlier layers plus its upper directory,
            # merged into one: copy the earlier layer, then the upper on top of it.
            copy_tree(workspace.layers[0], target, self.capabilities.reflink)
            copy_over(workspace.rw / "upper", target)
        else:
            copy_tree(workspace.rw / "upper", target, self.capabilities.reflink)

    # ------------------------------------------------------------------ setup

    def run_setup(
        self, tree: Path, setup: list[str], full_env: dict[str, str], launcher: Launcher
    ) -> None:
        """Run setup commands (network allowed: they install dependencies)."""
        for command in setup:
            outcome = run_command(
                command, cwd=str(tree), env=full_env, timeout=self.setup_timeout,
                launcher=launcher,
            )
            if outcome.timed_out or outcome.exit_code != 0:
                why = "timed out" if outcome.timed_out else f"exited {outcome.exit_code}"
                raise SetupFailed(f"setup command {why}: {command}\n{outcome.output[-2000:]}")

    def hand_over(self, path: Path, recursive: bool = False) -> None:
        """Give ``path`` to the uid that root inside the sandbox is (or to ``run_as``)."""
        owner = self.sandbox.owner
        if owner is None or not path.exists():
            return
        uid, gid = owner
        if recursive:
            subprocess.run(["chown", "-R", "-h", f"{uid}:{gid}", "--", str(path)], check=True,
                           stdin=subprocess.DEVNULL, capture_output=True)
        else:
            os.lchown(path, uid, gid)

    def hand_over_tree(self, tree: Path) -> None:
        """Give a checked-out tree to the sandbox uid, except git's object files: a local clone
        hard-links them with the mirror's, and the mirror (shared by every template of the
        repository) must stay root's. New objects still go into directories the uid owns."""
        owner = self.sandbox.owner
        if owner is None:
            return
        uid, gid = owner
        objects = tree / ".git" / "objects"
        subprocess.run(
            ["find", str(tree), "-path", str(objects), "-prune", "-o",
             "-exec", "chown", "-h", f"{uid}:{gid}", "--", "{}", "+"],
            check=True, stdin=subprocess.DEVNULL, capture_output=True,
        )
        if objects.is_dir():
            subprocess.run(
                ["find", str(objects), "-type", "d", "-exec", "chown", f"{uid}:{gid}", "--",
                 "{}", "+"],
                check=True, stdin=subprocess.DEVNULL, capture_output=True,
            )

    def template_setup(self, tree: Path, setup: list[str], env: dict[str, str]) -> None:
        """Setup of a template, run with the template at the fixed path (see templates.py).

        What setup writes into the runtime directories (a ``pip install`` into the image's
        interpreter) is kept as the template's own layer, below every workspace's.
        """
        root = tree.parent
        root.chmod(0o711)
        tmp = root / "tmp"
        (tmp / "home").mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o1777)
        self.hand_over_tree(tree)
        self.hand_over(tmp, recursive=True)
        group = self.groups.create(f"template-{root.name}") if self.groups is not None else None
        # Mount points with the workspaces' (where transient mounts live); the upper layers in
        # the template, where they stay.
        mount_holder = self.root / f"template-{root.name}"
        mount_holder.mkdir(mode=0o711, exist_ok=True)
        namespace = None
        binds: tuple[Bind, ...] = ()
        try:
            if self.namespaces is not None and setup:
                namespace = self.namespaces.for_holder(mount_holder)
            if self.runtime is not None and setup:
                binds = self.runtime.mount(mount_holder, root)
            launcher = self.sandbox.launcher(tree, tmp, deny_network=False, group=group,
                                             binds=binds, args_dir=root, namespace=namespace)
            full_env = self.env_builder(self.sandbox.visible_tmp(tmp), env)
            self.run_setup(tree, setup, full_env, launcher=launcher)
        finally:
            if group is not None:
                group.kill_all()
            if self.runtime is not None and binds:
                self.runtime.unmount(mount_holder)
                # The layers stay; their overlay work directories are not needed any more.
                for work in (root / "runtime").glob("*/work"):
                    remove_tree(work)
            if namespace is not None:
                namespace.close()
                unmount(mount_holder)
            remove_tree(mount_holder)
            remove_tree(tmp)
            if group is not None:
                self.release_group(group)
