"""Reading request bodies into protocol models, with errors a client can act on."""

from __future__ import annotations

from typing import TypeVar

from flask import request
from pydantic import BaseModel, ValidationError

from task_executor.errors import InvalidRequest, ValidationFailed

Model = TypeVar("Model", bound=BaseModel)


def parse_body(model: type[Model]) -> Model:
    """The request's JSON body as ``model``: 400 invalid_json, 422 validation_error otherwise."""
    raw = request.get_data(cache=False)
    if not raw.strip():
        raise InvalidRequest(
            "the request body is empty; a JSON object is expected", code="empty_body"
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if any(error["type"] == "json_invalid" for error in errors):
            raise InvalidRequest(
                f"malformed JSON: {errors[0]['msg']}", code="invalid_json"
            ) from None
        details = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
            for error in errors[:20]
        )
        raise ValidationFailed(f"invalid {model.__name__}: {details}") from None
