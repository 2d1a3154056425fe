"""``POST /task/submit``: single-shot grading."""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from sandbox_client.protocol import TaskResult, TaskSpec
from task_executor.grading.grader import GradingJob
from task_executor.service.metrics import observe_grading

from .bodies import parse_body
from .idempotency import graded_once

blueprint = Blueprint("task", __name__)


@blueprint.post("/task/submit")
def submit() -> Response:
    spec = parse_body(TaskSpec)
    services = current_app.extensions["dockyard"]

    def grade() -> TaskResult:
        with services.task_slots.hold():
            result = services.grader.grade(GradingJob.from_task(spec))
        observe_grading(result)
        return result

    # No verdict is not worth replaying: a retry of an execution_error grades again.
    return graded_once("task", spec, grade, keep=lambda result: result.status != "execution_error")
