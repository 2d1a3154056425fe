"""The OpenAPI 3.1 document, generated from the protocol models (never written by hand)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sandbox_client import protocol
from task_executor import __version__

_JSON_ROUTES: list[tuple[str, str, type[BaseModel] | None, type[BaseModel], str]] = [
    ("/task/submit", "post", protocol.TaskSpec, protocol.TaskResult, "Grade one patch"),
    ("/session/start", "post", protocol.SessionStartSpec, protocol.SessionStartResult,
     "Open a session: fresh tree, persistent shell"),
    ("/session/{session_id}/exec", "post", protocol.ExecRequest, protocol.ExecResult,
     "Run one command in the session's shell"),
    ("/session/{session_id}/reset", "post", None, protocol.SessionStartResult,
     "Back to the base tree and a fresh shell"),
    ("/session/{session_id}", "get", None, protocol.SessionState, "Session state"),
    ("/session/{session_id}/snapshot", "post", protocol.SnapshotRequest, protocol.SnapshotInfo,
     "A named read-only capture of the workspace"),
    ("/session/{session_id}/fork", "post", protocol.ForkRequest, protocol.SessionStartResult,
     "A new session from this one's current tree, cwd and exported environment"),
    ("/session/{session_id}/finish", "post", protocol.FinishSpec, protocol.FinishResult,
     "Capture the diff, grade it, close the session"),
    ("/session/{session_id}", "delete", None, protocol.SessionClosed, "Close without grading"),
    ("/session/{session_id}/file", "put", None, protocol.FileWriteResult,
     "Write raw bytes to ?path= (in the tree, or any absolute path the sandbox may write)"),
    ("/session/{session_id}/interrupt", "post", protocol.InterruptRequest,
     protocol.InterruptResult, "SIGINT the command running in a shell; the shell stays"),
    ("/session/{session_id}/shell/{name}", "delete", None, protocol.ShellClosed,
     "Close a named shell"),
    ("/session/{session_id}/upload", "post", None, protocol.UploadResult,
     "Extract a tar archive (modes kept) into the directory ?path= inside the sandbox"),
    ("/health", "get", None, protocol.HealthResponse, "Liveness and capabilities (no auth)"),
]
_IMAGE_ROUTES = ("/task/submit", "/session/start")
"""Routes whose spec names a task image: 421 image_mismatch where this executor runs another."""
_IDEMPOTENT = ("/task/submit", "/session/{session_id}/finish")
_IDEMPOTENCY_PARAMETER = {
    "name": protocol.IDEMPOTENCY_HEADER,
    "in": "header",
    "required": False,
    "description": "One key per logical submission, sent again only by a retry of that call, "
    "which then gets the stored answer (409 task_in_progress while it is still graded; 422 "
    "idempotency_key_reused for a different body under the same key). Without it the call "
    "always grades afresh.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}
_RAW_BODY = {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                  "format": "binary"}}}}


def _body(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": ref}}}}


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    models = {protocol.ErrorResponse}
    for _, _, request_model, response_model, _ in _JSON_ROUTES:
        models.add(response_model)
        if request_model is not None:
            models.add(request_model)
    ordered = sorted(models, key=lambda model: model.__name__)
    refs, schema = models_json_schema(
        [(model, "validation" if _is_request(model) else "serialization") for model in ordered],
        ref_template="#/components/schemas/{model}",
    )

    def ref(model: type[BaseModel]) -> str:
        mode = "validation" if _is_request(model) else "serialization"
        return refs[(model, mode)]["$ref"]

    error = {"description": "Error", **_body(ref(protocol.ErrorResponse))}
    paths: dict[str, Any] = {}
    for path, method, request_model, response_model, summary in _JSON_ROUTES:
        operation: dict[str, Any] = {
            "summary": summary,
            "responses": {"200": {"description": "OK", **_body(ref(response_model))}},
        }
        if request_model is not None:
            operation["requestBody"] = {"required": True, **_body(ref(request_model))}
        if "{session_id}" in path:
            operation["parameters"] = [_parameter("session_id", "path")]
        if path in _IDEMPOTENT:
            operation.setdefault("parameters", []).append(_IDEMPOTENCY_PARAMETER)
            operation["responses"]["200"]["headers"] = {
                protocol.REPLAYED_HEADER: {
                    "description": "`true` when the answer is the one stored for this "
                    "Idempotency-Key (a retry), absent when this call graded.",
                    "schema": {"type": "string", "enum": ["true"]},
                }
            }
        if "{name}" in path:
            operation["parameters"].append(_parameter("name", "path"))
        if path.endswith(("/file", "/upload")):
            operation["parameters"].append(_parameter("path", "query"))
            # An upload's tar is raw bytes too (any Content-Type is taken; x-tar by custom).
            operation["requestBody"] = {"required": True, **_RAW_BODY}
        if path != "/health":
            operation["security"] = [{"bearer": []}]
            for status in ("400", "401", "403", "404", "409", "413", "422", "429"):
                operation["responses"][status] = error
        if path in _IMAGE_ROUTES:
            operation["responses"]["421"] = error
        paths.setdefault(path, {})[method] = operation
    paths["/session/{session_id}/file"]["get"] = {
        "summary": "Read a file's raw bytes (X-File-Size and X-File-SHA256 headers)",
        "parameters": [_parameter("session_id", "path"), _parameter("path", "query")],
        "security": [{"bearer": []}],
        "responses": {"200": {"description": "The file's bytes", **_RAW_BODY},
                      **{s: error for s in ("400", "401", "403", "404")}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Dockyard task executor", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schema.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _parameter(name: str, where: str) -> dict[str, Any]:
    schema = {"type": "string", "minLength": 1}
    return {"name": name, "in": where, "required": True, "schema": schema}


def _is_request(model: type[BaseModel]) -> bool:
    return model.model_config.get("extra") == "forbid"
