"""The Flask application factory: services, auth, blueprints and the one error renderer."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from task_executor.config import Settings
from task_executor.errors import ExecutorError, Forbidden, Unauthorized, http_error_code

from . import lifecycle, metrics, peers, requestlog
from .services import Services
from .wire import WireJSONProvider

log = logging.getLogger(__name__)

OPEN_ROUTES = {"/health"}


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
    app.json = WireJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["dockyard"] = services = Services.build(settings)
    requestlog.install(app)  # first, so requests refused by the hooks below carry an id too

    sandbox_uid = services.workspaces.capabilities.sandbox_uid
    if sandbox_uid is not None and sandbox_uid == os.geteuid():
        sandbox_uid = None  # an unprivileged executor shares its uid with its sandboxes

    @app.before_request
    def refuse_code_under_test() -> None:
        # Before the token check: a sandbox sharing the host's network never reaches a route,
        # by loopback or by any address of this host (a pod's own IP is as near as 127.0.0.1).
        address, port = request.remote_addr or "", request.environ.get("REMOTE_PORT")
        if sandbox_uid is None or not port:
            return
        # One lookup per connection, not per request (reading /proc/net/tcp costs milliseconds):
        # the verdict is kept on waitress's channel, which is this one socket, kept alive.
        checked = request.environ.get("waitress.client_disconnected")
        channel = getattr(checked, "__self__", None)
        if channel is not None and getattr(channel, "dockyard_peer_trusted", False):
            return
        owners = peers.socket_owners(address, int(port), _our_port(channel))
        if sandbox_uid in owners:
            raise Forbidden("requests from code under test are refused", code="from_sandbox")
        if peers.NOT_FOUND in owners and peers.is_loopback(address):
            # A live loopback connection is always in this namespace's table: not finding it
            # is no reason to trust it.
            raise Forbidden("the caller's connection could not be identified",
                            code="from_sandbox")
        if channel is not None:
            channel.dockyard_peer_trusted = True

    def _our_port(channel: Any) -> int:
        """The port this connection reached (its own socket's, else the server's)."""
        with contextlib.suppress(AttributeError, OSError, IndexError):
            return int(channel.socket.getsockname()[1])
        return int(request.environ.get("SERVER_PORT") or 0)

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
