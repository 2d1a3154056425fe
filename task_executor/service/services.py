"""``Services``: the domain objects the routes use, built once per app from the settings.

Not Flask-aware: the app factory keeps one in ``app.extensions["dockyard"]``, and the lifecycle and
metrics modules, which take it from there, import it from here rather than from the app (so no
module imports the app back, not even for a type).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import partial

from task_executor.config import Settings
from task_executor.grading.grader import REPORTER_DIR, Grader, sandbox_env
from task_executor.grading.task_registry import TaskRegistry
from task_executor.sandbox import isolation
from task_executor.sessions.manager import SessionManager
from task_executor.workspaces.mirrors import MirrorCache
from task_executor.workspaces.templates import TemplateCache
from task_executor.workspaces.workspace import WorkspaceFactory

from .capacity import Slots


@dataclass
class Services:
    """Everything the routes use, made once per app (nothing is created at import time)."""

    settings: Settings
    mirrors: MirrorCache
    workspaces: WorkspaceFactory
    grader: Grader
    task_slots: Slots
    registry: TaskRegistry
    sessions: SessionManager

    @classmethod
    def build(cls, settings: Settings) -> Services:
        settings.base_dir.mkdir(parents=True, exist_ok=True)
        mirrors = MirrorCache(settings.base_dir / "mirrors", settings.mirror_budget_bytes)
        if settings.workspace_mode == "git-clone" or not settings.fixed_path:
            capabilities = isolation.Capabilities(
                overlay=False, mount_namespace=False,
                network_namespace=False, reflink=False,
            )
        else:
            capabilities = isolation.detect(settings.base_dir)
        sandbox = isolation.Sandbox(
            capabilities,
            fixed_path=isolation.prepare_fixed_path(settings.fixed_path, capabilities),
            hide=str(settings.base_dir),
            private_tmp=not isolation.needed_under_tmp(
                [str(REPORTER_DIR), sys.prefix, *os.environ.get("PATH", "").split(os.pathsep)]
            ),
            run_as=None if settings.run_as_uid is None else (
                settings.run_as_uid,
                settings.run_as_uid if settings.run_as_gid is None else settings.run_as_gid,
            ),
        )
        workspaces = WorkspaceFactory(
            settings.base_dir / "work",
            mirrors,
            templates=None,
            sandbox=sandbox,
            env_builder=partial(sandbox_env, settings),
            setup_timeout=settings.task_timeout,
        )
        if sandbox.fixed_path is not None:
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
            registry=TaskRegistry(ttl=settings.result_ttl),
        )
