"""The ``Idempotency-Key`` header: a call graded once, its retries answered from the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flask import Response, current_app, jsonify, request
from pydantic import BaseModel

from sandbox_client.protocol import IDEMPOTENCY_HEADER, REPLAYED_HEADER
from task_executor.errors import InvalidRequest
from task_executor.grading.task_registry import MAX_KEY_LENGTH, fingerprint

Answer = TypeVar("Answer", bound=BaseModel)


def idempotency_key(scope: str) -> str | None:
    """The request's ``Idempotency-Key`` under ``scope`` (the route's call), or None without one.

    1 to 255 visible ASCII characters, else 400 invalid_idempotency_key.
    """
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all("!" <= char <= "~" for char in key):
        raise InvalidRequest(
            f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_LENGTH} visible ASCII characters",
            code="invalid_idempotency_key",
        )
    return f"{scope} {key}"


def graded_once(
    scope: str,
    body: BaseModel,
    run: Callable[[], Answer],
    keep: Callable[[Answer], bool] = lambda answer: True,
) -> Response:
    """``run()``'s answer; for a retry under the same key, the stored one (marked replayed).

    Answers ``keep`` accepts are stored for the key's retries; a call without a key is neither.
    """
    key = idempotency_key(scope)
    registry = current_app.extensions["dockyard"].registry
    stored = registry.begin(key, fingerprint(body))
    if stored is not None:
        response = jsonify(stored.model_dump(mode="json"))
        response.headers[REPLAYED_HEADER] = "true"
        return response
    answer: Answer | None = None
    try:
        answer = run()
    finally:
        registry.end(key, answer if answer is not None and keep(answer) else None)
    return jsonify(answer.model_dump(mode="json"))
