"""The OpenAPI 3.1 document, generated from the protocol models (never written by hand)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sandbox_client import protocol

from . import __version__

_JSON_ROUTES: list[tuple[str, str, type[BaseModel] | None, type[BaseModel], str]] = [
    ("/task/submit", "post", protocol.TaskSpec, protocol.TaskResult, "Grade one patch"),
    ("/health", "get", None, protocol.HealthResponse, "Liveness and capabilities (no auth)"),
]


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
            for status in ("400", "401", "409", "413", "422", "429"):
                operation["responses"][status] = error
        if path != "/health":
            operation["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Dockyard task executor", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schema.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _is_request(model: type[BaseModel]) -> bool:
    return model.model_config.get("extra") == "forbid"
