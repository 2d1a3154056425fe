"""``GET /health`` (no auth) and ``GET /openapi.json``."""

from __future__ import annotations

import os
import subprocess
import time

from flask import Blueprint, current_app

from sandbox_client.protocol import HealthCapabilities, HealthResponse
from task_executor import __version__
from task_executor.service.openapi import openapi_document
from task_executor.sessions import headroom

blueprint = Blueprint("health", __name__)


def _trivial_command_seconds() -> float | None:
    started = time.monotonic()
    try:
        subprocess.run(["true"], timeout=2, check=True, stdin=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return None
    return time.monotonic() - started


@blueprint.get("/health")
def health() -> dict:
    services = current_app.extensions["dockyard"]
    seconds = _trivial_command_seconds()
    caps = services.workspaces.capabilities
    answer = HealthResponse(
        status="ok" if seconds is not None else "degraded",
        version=__version__,
        check_s=round(seconds if seconds is not None else 2.0, 4),
        capabilities=HealthCapabilities(
            workspace_mode=services.workspaces.mode,
            overlay=services.workspaces.mode == "overlay",
            namespaces=caps.mount_namespace,
            egress_guard=caps.network_namespace,
            fixed_path=services.workspaces.sandbox.fixed_path,
            private_tmp=caps.sandbox,
            sandbox=services.workspaces.sandbox_report(),
            deny_network_default=services.grader.default_denies_network(),
            image=services.settings.image,
        ),
        load={
            "tasks_running": services.task_slots.in_use,
            "task_capacity": services.task_slots.limit,
            "execs_running": services.exec_slots.in_use,
            "exec_capacity": services.exec_slots.limit,
            "sessions": services.sessions.live,
            "sessions_removing": services.sessions.reclaiming,
            "session_capacity": services.settings.max_sessions,
            "loadavg_1m": os.getloadavg()[0],
        },
        limits=headroom.limits(),
    )
    return answer.model_dump(mode="json")


@blueprint.get("/openapi.json")
def openapi() -> dict:
    return openapi_document()
