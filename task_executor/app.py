"""The Flask application factory: services, auth, blueprints and the one error renderer."""

from __future__ import annotations

import hmac
import logging
import os
import sys
from dataclasses import dataclass
from functools import partial

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from . import isolation, lifecycle, metrics, requestlog
from .capacity import Slots
from .config import Settings
from .errors import ExecutorError, Unauthorized, http_error_code
from .grading import REPORTER_DIR, Grader, sandbox_env
from .mirrors import MirrorCache
from .sessions import SessionManager
from .task_registry import TaskRegistry
from .templates import TemplateCache
from .workspace import WorkspaceFactory

log = logging.getLogger(__name__)

OPEN_ROUTES = {"/health"}


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


def error_response(
    code: str, message: str, status: int, headers: dict[str, str] | None = None
) -> Response:
    request_id = requestlog.current_request_id()
    response = jsonify({"error": {"code": code, "message": message, "request_id": request_id}})
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def create_app(settings: Settings | None = None) -> Flask:
    settings = (settings or Settings()).validated()
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["dockyard"] = services = Services.build(settings)
    requestlog.install(app)  # first, so requests refused by the hooks below carry an id too

    @app.before_request
    def require_token() -> None:
        if settings.token is None or request.path in OPEN_ROUTES:
            return
        supplied = request.headers.get("Authorization", "")
        expected = f"Bearer {settings.token}"
        if not hmac.compare_digest(supplied.encode(), expected.encode()):
            raise Unauthorized("missing or wrong bearer token")

    drain = lifecycle.install(app)
    metrics.install(
        app,
        services,
        lambda: {"draining": float(drain.draining), "requests_in_flight": drain.in_flight},
    )

    @app.errorhandler(ExecutorError)
    def render_executor_error(exc: ExecutorError) -> Response:
        return error_response(exc.code, exc.message, exc.http_status, exc.headers())

    @app.errorhandler(HTTPException)
    def render_http_error(exc: HTTPException) -> Response:
        code = http_error_code(exc.name or "http error")
        # Keep the headers the exception carries (Allow on a 405), not its HTML content type.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return error_response(code, exc.description or exc.name, exc.code or 500, headers)

    @app.errorhandler(Exception)
    def render_unexpected(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response("internal_error", "internal error (see the executor log)", 500)

    from .api import health, session, task

    app.register_blueprint(health.blueprint)
    app.register_blueprint(task.blueprint)
    app.register_blueprint(session.blueprint)
    return app
