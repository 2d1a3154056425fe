"""``Services``: the domain objects the routes use, built once per app from the settings.

Not Flask-aware: the app factory keeps one in ``app.extensions["dockyard"]``, and the lifecycle and
metrics modules, which take it from there, import it from here rather than from the app (so no
module imports the app back, not even for a type).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from task_executor.config import Settings
from task_executor.errors import ExecutorError
from task_executor.grading.grader import REPORTER_DIR, Grader, owner_token, sandbox_env
from task_executor.grading.task_registry import TaskRegistry
from task_executor.sandbox import host_budget, isolation, seccomp
from task_executor.sandbox.capabilities import Capabilities, detect
from task_executor.sandbox.cgroups import Groups
from task_executor.sandbox.hostview import PRIVATE_TOP, HostView, build_host_view, host_view_argv
from task_executor.sandbox.limits import Limits
from task_executor.sandbox.namespaces import LaunchNamespaces
from task_executor.sessions.manager import SessionManager
from task_executor.workspaces.mirrors import MirrorCache
from task_executor.workspaces.runtime import RuntimeLayers
from task_executor.workspaces.templates import TemplateCache
from task_executor.workspaces.workspace import WorkspaceFactory, launch_args_root

from .capacity import Slots
from .limits import stop_ignoring_signals

log = logging.getLogger(__name__)

PRIVATE_TOP_MOUNTS = tuple(f"/{name}" for name in sorted(PRIVATE_TOP))


class SandboxUnavailable(ExecutorError):
    code = "sandbox_unavailable"


def seccomp_filter(base_dir: Path, capabilities: Capabilities) -> Path | None:
    """The keyring filter every sandbox gets (see ``sandbox.seccomp``), or None (reported)."""
    if not capabilities.sandbox:
        return None
    written = seccomp.write_filter(base_dir / "seccomp.bpf")
    if written is None:
        capabilities.missing["seccomp"] = f"no filter for {os.uname().machine}: kernel " \
            "keyrings are shared by every sandbox"
    return written


def searchable_base_dir(base_dir: Path) -> None:
    """Let the sandbox uid pass through the base directory (o+x, never o+r): bwrap resolves
    every workspace below it as that uid. The directory is the executor's own; what is in it
    keeps its own modes (the log is 0600). Its parents are not ours to change: one the sandbox
    uid cannot pass makes the sandbox probe fail, and the executor refuses to start, naming it."""
    mode = base_dir.stat().st_mode
    if not mode & 0o001:
        os.chmod(base_dir, (mode & 0o7777) | 0o001)
        log.warning("base dir %s was not searchable by others: made it o+x so the sandbox uid "
                    "can reach the workspaces below it", base_dir)


def executor_paths() -> list[str]:
    """The executor's own interpreter, venv and code: hidden from code under test."""
    import task_executor

    package_root = Path(task_executor.__file__).resolve().parent.parent
    return [sys.prefix, sys.base_prefix, sys.exec_prefix, str(package_root)]


@dataclass
class Services:
    """Everything the routes use, made once per app (nothing is created at import time)."""

    settings: Settings
    mirrors: MirrorCache
    workspaces: WorkspaceFactory
    grader: Grader
    task_slots: Slots
    exec_slots: Slots
    registry: TaskRegistry
    sessions: SessionManager

    @classmethod
    def build(cls, settings: Settings) -> Services:
        stop_ignoring_signals()  # what it ignores, every command it runs would ignore too
        settings.base_dir.mkdir(parents=True, exist_ok=True)
        searchable_base_dir(settings.base_dir)
        mirrors = MirrorCache(settings.base_dir / "mirrors", settings.mirror_budget_bytes)
        capabilities = detect(settings.base_dir, settings.sandbox_uid,
                              sandbox=settings.sandbox_mode != "none", bwrap_choice=settings.bwrap)
        if settings.sandbox_mode != "none" and not capabilities.sandbox:
            # Fail closed: code under test never runs unsandboxed unless the operator said so.
            raise SandboxUnavailable(
                f"cannot sandbox code under test: {capabilities.missing.get('sandbox')}. Fix "
                "that, or set DOCKYARD_SANDBOX=none to run code under test unsandboxed (never "
                "for untrusted code)")
        if not capabilities.sandbox:
            log.error("NO SANDBOX (DOCKYARD_SANDBOX=none): code under test runs with the "
                      "executor's privileges")
        limits = Limits(
            pids=settings.pids_limit, memory_bytes=settings.memory_limit_bytes,
            disk_bytes=settings.disk_limit_bytes, fsize_bytes=settings.fsize_limit_bytes,
            shm_bytes=settings.shm_bytes,
            all_pids=host_budget.resolve(settings.all_workspaces_pids_limit,
                                         host_budget.default_pids, settings.host_share),
            all_memory_bytes=host_budget.resolve(settings.all_workspaces_memory_limit_bytes,
                                                 host_budget.default_memory_bytes,
                                                 settings.host_share),
        )
        if settings.image_root is not None and not capabilities.sandbox:
            raise SandboxUnavailable(  # fail closed: never the host's root for an image's code
                f"--image-root needs the sandbox to show it as the root, and there is none: "
                f"{capabilities.missing.get('sandbox', 'unknown reason')}")
        fixed_path = isolation.prepare_fixed_path(settings.fixed_path, capabilities)
        runtime_dirs = settings.runtime_dirs
        if settings.image_root is not None and (settings.image_root / "root").is_dir() and (
                "/root" not in runtime_dirs):
            # The image's own /root, copy-on-write per workspace as /usr/local is: its
            # .bashrc (conda's activation in SWE-bench's images) stays, and tools go in.
            runtime_dirs = (*runtime_dirs, "/root")
        # An image's root holds none of the host's paths: nothing of the executor's to hide
        # (hiding its namesakes, /opt/venv say, would take the image's own away).
        hide = () if settings.image_root is not None else isolation.hidden_paths(
            settings.base_dir, [*executor_paths(), *settings.hide_paths])
        if capabilities.sandbox:
            view = build_host_view(
                settings.base_dir / "view", settings.base_dir, hide,
                keep_hiding_below=runtime_dirs,
                mount_points=(*PRIVATE_TOP_MOUNTS, *([fixed_path] if fixed_path else [])),
                root=settings.image_root or Path("/"),
            )
            if not view.prebuilt:
                capabilities.missing["host_view"] = view.reason
        else:
            view = HostView(host_view_argv(settings.base_dir, hide), hide, prebuilt=False)
        sandbox = isolation.Sandbox(
            capabilities,
            fixed_path=fixed_path,
            hide=view.hide,
            limits=limits,
            run_as=None if settings.run_as_uid is None else (
                settings.run_as_uid,
                settings.run_as_uid if settings.run_as_gid is None else settings.run_as_gid,
            ),
            reporter_dir=REPORTER_DIR,
            host_view=view.argv,
            seccomp_filter=seccomp_filter(settings.base_dir, capabilities),
            root="host" if settings.image_root is None else "image",
            cgroup_tree=(Path(settings.image_root or "/") / "sys/fs/cgroup").is_dir(),
            has_root_home=(Path(settings.image_root or "/") / "root").is_dir(),
        )
        executor_id = owner_token(settings.base_dir)
        groups = None
        if capabilities.cgroup_controllers:
            def make_groups() -> Groups:
                controllers = capabilities.cgroup_controllers - (
                    frozenset() if settings.cpu_fair_share else {"cpu"})
                return Groups(controllers, executor_id,
                              pids_max=limits.pids, memory_bytes=limits.memory_bytes,
                              all_pids=limits.all_pids, all_memory_bytes=limits.all_memory_bytes)

            make_groups().remove_all()  # what a crashed predecessor left
            groups = make_groups()
        runtime = None
        if capabilities.idmap and capabilities.overlay and runtime_dirs:
            assert capabilities.sandbox_uid is not None
            runtime = RuntimeLayers(settings.base_dir / "runtime", runtime_dirs,
                                    capabilities.sandbox_uid,
                                    source_root=settings.image_root or Path("/"))
            if "/root" in runtime.directories:  # the home is that layer, not an empty one
                sandbox = replace(sandbox, home_is_layer=True)
        args_root = launch_args_root(settings.base_dir, sandbox)
        namespaces = None
        if capabilities.sandbox:
            try:  # last: the clean namespace copies every mount made above
                namespaces = LaunchNamespaces()
            except OSError as exc:
                log.warning("sandboxes start from the executor's mount namespace: %s", exc)
                capabilities.missing["launch_namespace"] = (
                    f"sandboxes copy the executor's whole mount table ({exc})")
        workspaces = WorkspaceFactory(
            settings.base_dir / "work",
            mirrors,
            templates=None,
            sandbox=sandbox,
            env_builder=partial(sandbox_env, settings, sandbox.visible_reporter()),
            setup_timeout=settings.task_timeout,
            groups=groups,
            runtime=runtime,
            namespaces=namespaces,
            args_root=args_root,
        )
        if sandbox.fixed_path is not None and settings.workspace_mode != "git-clone":
            # Templates pay off only where every workspace can see them at the fixed path.
            workspaces.templates = TemplateCache(
                settings.base_dir / "templates",
                mirrors,
                run_setup=workspaces.template_setup,
                budget_bytes=settings.template_budget_bytes,
            )
        grader = Grader(settings, workspaces)
        return cls(
            settings=settings,
            mirrors=mirrors,
            workspaces=workspaces,
            grader=grader,
            sessions=SessionManager(settings, workspaces, grader),
            task_slots=Slots(settings.max_tasks, "grading"),
            # Most commands take well under a second: the caller is asked back soon.
            exec_slots=Slots(settings.max_execs, "long session call", retry_after=1,
                             code="executor_busy"),
            registry=TaskRegistry(ttl=settings.result_ttl),
        )
