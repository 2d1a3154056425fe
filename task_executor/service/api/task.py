"""``POST /task/submit``: single-shot grading."""

from __future__ import annotations

from flask import Blueprint, current_app

from sandbox_client.protocol import TaskSpec
from task_executor.grading.grader import GradingJob
from task_executor.grading.task_registry import request_key
from task_executor.service.metrics import observe_grading

from .bodies import parse_body

blueprint = Blueprint("task", __name__)


@blueprint.post("/task/submit")
def submit() -> dict:
    spec = parse_body(TaskSpec)
    services = current_app.extensions["dockyard"]
    key = request_key(spec)
    stored = services.registry.begin(key)
    if stored is not None:
        return stored.model_dump(mode="json")
    result = None
    try:
        with services.task_slots.hold():
            result = services.grader.grade(GradingJob.from_task(spec))
        observe_grading(result)
    finally:
        services.registry.end(key, result)
    return result.model_dump(mode="json")
