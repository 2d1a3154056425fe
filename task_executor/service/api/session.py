"""Session routes: start, exec, interrupt, shells, file read/write, upload, reset, state,
finish, close."""

from __future__ import annotations

from contextlib import AbstractContextManager

from flask import Blueprint, Response, current_app, request

from sandbox_client.protocol import (
    ExecRequest,
    FinishResult,
    FinishSpec,
    ForkRequest,
    InterruptRequest,
    InterruptResult,
    SessionClosed,
    SessionStartSpec,
    ShellClosed,
    SnapshotRequest,
)
from task_executor.errors import InvalidRequest
from task_executor.service.metrics import observe_exec, observe_grading

from .bodies import parse_body
from .idempotency import graded_once

blueprint = Blueprint("session", __name__, url_prefix="/session")


def _services():  # type: ignore[no-untyped-def]
    return current_app.extensions["dockyard"]


def _long_call() -> AbstractContextManager[None]:
    """A slot for a call that holds its thread as long as a command or a setup runs, taken
    before anything runs: full, the call is refused (429 executor_busy) and never waits on a
    thread that /health, DELETE and the gradings need."""
    return _services().exec_slots.hold()


def _path_argument() -> str:
    path = request.args.get("path")
    if not path:
        raise InvalidRequest("query parameter 'path' is required", code="missing_path")
    return path


@blueprint.post("/start")
def start() -> dict:
    spec = parse_body(SessionStartSpec)
    with _long_call():
        return _services().sessions.start(spec).model_dump(mode="json")


@blueprint.post("/<session_id>/exec")
def exec_command(session_id: str) -> Response:
    body = parse_body(ExecRequest)
    with _long_call():
        result = _services().sessions.exec(session_id, body.command, body.timeout, body)
    observe_exec(result)
    # The hot path: pydantic's serializer writes the JSON directly, a third of the time of
    # model_dump() + Flask's encoder.
    return Response(result.model_dump_json(), mimetype="application/json")


@blueprint.post("/<session_id>/interrupt")
def interrupt(session_id: str) -> dict:
    # A short call: it must get through while the exec it stops holds a long-call slot.
    body = parse_body(InterruptRequest) if request.get_data() else InterruptRequest()
    stopped = _services().sessions.interrupt(session_id, body.shell)
    return InterruptResult(interrupted=stopped).model_dump(mode="json")


@blueprint.delete("/<session_id>/shell/<name>")
def close_shell(session_id: str, name: str) -> dict:
    _services().sessions.close_shell(session_id, name)
    return ShellClosed(session_id=session_id, shell=name).model_dump(mode="json")


@blueprint.get("/<session_id>/file")
def read_file(session_id: str) -> Response:
    content = _services().sessions.read(session_id, _path_argument())
    response = Response(content.data, mimetype="application/octet-stream")
    response.headers["X-File-Size"] = str(len(content.data))
    response.headers["X-File-SHA256"] = content.sha256
    return response


@blueprint.put("/<session_id>/file")
def write_file(session_id: str) -> dict:
    path = _path_argument()
    data = request.get_data(cache=False)
    return _services().sessions.write(session_id, path, data).model_dump(mode="json")


@blueprint.post("/<session_id>/upload")
def upload(session_id: str) -> dict:
    path = _path_argument()
    data = request.get_data(cache=False)
    if not data:
        raise InvalidRequest("the body is empty; a tar archive is expected", code="empty_body")
    with _long_call():
        return _services().sessions.upload(session_id, path, data).model_dump(mode="json")


@blueprint.post("/<session_id>/reset")
def reset(session_id: str) -> dict:
    with _long_call():
        return _services().sessions.reset(session_id).model_dump(mode="json")


@blueprint.post("/<session_id>/snapshot")
def snapshot(session_id: str) -> dict:
    body = parse_body(SnapshotRequest) if request.get_data() else SnapshotRequest()
    with _long_call():
        return _services().sessions.snapshot(session_id, body.name).model_dump(mode="json")


@blueprint.post("/<session_id>/fork")
def fork(session_id: str) -> dict:
    body = parse_body(ForkRequest) if request.get_data() else ForkRequest()
    with _long_call():
        return _services().sessions.fork(session_id, body.snapshot).model_dump(mode="json")


@blueprint.get("/<session_id>")
def state(session_id: str) -> dict:
    return _services().sessions.state(session_id).model_dump(mode="json")


@blueprint.post("/<session_id>/finish")
def finish(session_id: str) -> Response:
    spec = parse_body(FinishSpec)
    services = _services()

    def grade() -> FinishResult:
        with services.task_slots.hold():
            finished = services.sessions.finish(session_id, spec)
        observe_grading(finished.result, "finish")
        return finished

    # Every answer is kept, execution_error too: the session is gone, a retry cannot regrade.
    return graded_once(f"finish {session_id}", spec, grade)


@blueprint.delete("/<session_id>")
def close(session_id: str) -> dict:
    _services().sessions.close(session_id)
    return SessionClosed(session_id=session_id, closed=True).model_dump(mode="json")
