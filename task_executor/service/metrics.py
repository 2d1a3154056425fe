"""``GET /metrics``: the executor's Prometheus metrics, one registry per app.

What is counted where:

* requests by method, route and status, and their latency -- in an ``after_request`` hook; the
  route label is the URL rule (``/session/<session_id>/exec``), never the raw path, so session ids
  cannot explode the label set;
* gradings by final status and source (``submit`` or ``finish``), by whether their template was
  reused or built for them (the result's ``template_hit``), their duration and per-phase
  durations -- ``observe_grading``, called by the routes (the submit route alone knows whether
  the verdict was graded or replayed from the idempotency registry);
* session commands, their timeouts and truncated outputs -- ``observe_exec``, called by the
  ``exec`` route with the result it answers (not parsed back from the answer's JSON: ``exec`` is
  the hot path);
* live state (tasks running, sessions, capacities, draining, processes the reaper killed,
  template cache hits, misses, builds and disk) -- read at scrape time by a collector, so it can
  never drift from the truth.

Histograms and counters live in a private ``CollectorRegistry`` (not the global one), so several
apps in one process -- the test-suite -- never share or clash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from sandbox_client.protocol import ExecResult, TaskResult
from task_executor.sandbox import reaper

from .requestlog import elapsed
from .services import Services

log = logging.getLogger(__name__)

EXTENSION = "dockyard.metrics"
UNMATCHED_ROUTE = "unmatched"

_REQUEST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
_GRADING_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800)

blueprint = Blueprint("metrics", __name__)


class ExecutorMetrics:
    """The metrics of one app; ``observe_*`` are cheap and thread-safe."""

    def __init__(self, services: Services, extra_state: Callable[[], dict[str, float]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "dockyard_http_requests",
            "HTTP requests answered, by method, route (URL rule) and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "dockyard_http_request_duration_seconds",
            "Time from the request's arrival in Flask to its answer, by route.",
            ["route"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.tasks = Counter(
            "dockyard_tasks",
            "Gradings by final status and source (submit or session finish).",
            ["status", "source"],
            registry=self.registry,
        )
        self.grading_templates = Counter(
            "dockyard_grading_templates",
            "Gradings by whether their template was reused or built for them (template_hit).",
            ["template", "source"],
            registry=self.registry,
        )
        self.grading_seconds = Histogram(
            "dockyard_grading_duration_seconds",
            "Wall time of one grading, checkout to cleanup.",
            ["source"],
            buckets=_GRADING_BUCKETS,
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "dockyard_grading_phase_duration_seconds",
            "Wall time of each phase of a grading (checkout, setup, apply, tests, cleanup).",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )
        self.commands = Counter(
            "dockyard_session_commands",
            "Session commands run (exec calls that returned a result).",
            registry=self.registry,
        )
        self.command_timeouts = Counter(
            "dockyard_session_command_timeouts",
            "Session commands killed by their timeout.",
            registry=self.registry,
        )
        self.truncated_outputs = Counter(
            "dockyard_session_truncated_outputs",
            "Session commands whose output was cut to its head and tail.",
            registry=self.registry,
        )
        self.registry.register(_LiveState(services, extra_state))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def observe_grading(self, result: TaskResult, source: str) -> None:
        self.tasks.labels(result.status, source).inc()
        if result.template_hit is not None:
            template = "reused" if result.template_hit else "built"
            self.grading_templates.labels(template, source).inc()
        self.grading_seconds.labels(source).observe(result.duration_s)
        if result.phases is not None:
            for phase, seconds in result.phases.model_dump().items():
                self.phase_seconds.labels(phase).observe(seconds)

    def observe_exec(self, result: ExecResult) -> None:
        self.commands.inc()
        if result.timed_out:
            self.command_timeouts.inc()
        if result.truncated:
            self.truncated_outputs.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LiveState(Collector):
    """Gauges and totals read from the running services at scrape time."""

    def __init__(self, services: Services, extra_state: Callable[[], dict[str, float]]) -> None:
        self.services = services
        self.extra_state = extra_state

    def collect(self) -> Iterator[Any]:
        services = self.services
        yield _gauge("dockyard_tasks_running", "Gradings in progress.", services.task_slots.in_use)
        yield _gauge(
            "dockyard_task_capacity", "Gradings allowed at once.", services.task_slots.limit
        )
        yield _gauge(
            "dockyard_execs_running",
            "Long session calls running (exec, start, fork, reset, snapshot).",
            services.exec_slots.in_use,
        )
        yield _gauge(
            "dockyard_exec_capacity",
            "Long session calls allowed at once.",
            services.exec_slots.limit,
        )
        yield _gauge("dockyard_sessions_live", "Live sessions.", services.sessions.live)
        yield _gauge(
            "dockyard_sessions_removing",
            "Deleted sessions whose workspaces are still being removed.",
            services.sessions.reclaiming,
        )
        yield _gauge(
            "dockyard_session_capacity", "Sessions allowed at once.", services.settings.max_sessions
        )
        for name, value in self.extra_state().items():
            yield _gauge(f"dockyard_{name}", f"Executor state: {name}.", value)
        killed = reaper.killed_totals()
        yield _counter(
            "dockyard_killed_processes", "Processes the reaper had to kill.", killed.processes
        )
        yield _counter(
            "dockyard_killed_process_groups",
            "Distinct process groups among the processes the reaper had to kill.",
            killed.groups,
        )
        stats = _template_stats(services)
        if stats is not None:
            yield _counter(
                "dockyard_template_cache_hits",
                "Workspaces made from a ready template.",
                stats.get("hits", 0),
            )
            yield _counter(
                "dockyard_template_cache_misses",
                "Templates that had to be prepared.",
                stats.get("misses", 0),
            )
            yield _counter(
                "dockyard_template_builds",
                "Templates built (clone, checkout and setup) to completion.",
                stats.get("builds", 0),
            )
            yield _gauge(
                "dockyard_template_disk_bytes",
                "Disk used by templates.",
                stats.get("disk_bytes", 0),
            )
            yield _gauge("dockyard_templates", "Templates kept.", stats.get("templates", 0))


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _template_stats(services: Services) -> dict[str, float] | None:
    """The template cache's ``stats()``, wherever this build keeps the cache (else None)."""
    cache = getattr(services, "templates", None) or getattr(services.workspaces, "templates", None)
    if cache is None or not hasattr(cache, "stats"):
        return None
    try:
        return dict(cache.stats())
    except Exception:  # a scrape must never fail because one source did
        log.exception("template cache stats failed")
        return None


# -- wiring into the app ---------------------------------------------------------------------


def install(
    app: Flask, services: Services, extra_state: Callable[[], dict[str, float]] = dict
) -> ExecutorMetrics:
    """Count every request of ``app`` and serve ``GET /metrics`` (after ``requestlog.install``,
    whose arrival time the latency is measured from).

    ``extra_state`` adds gauges read at scrape time (``{"draining": 0.0}`` becomes
    ``dockyard_draining``).
    """
    # The ``*_created`` series would double the exposition, and nothing here needs them.
    disable_created_metrics()
    metrics = ExecutorMetrics(services, extra_state)
    app.extensions[EXTENSION] = metrics

    @app.after_request
    def count_request(response: Response) -> Response:
        route = request.url_rule.rule if request.url_rule is not None else UNMATCHED_ROUTE
        metrics.observe_request(request.method, route, response.status_code, elapsed())
        return response

    app.register_blueprint(blueprint)
    return metrics


def observe_grading(result: TaskResult, source: str = "submit") -> None:
    """Count a grading that the current request ran (a no-op in an app without metrics)."""
    metrics = current_app.extensions.get(EXTENSION)
    if metrics is not None:
        metrics.observe_grading(result, source)


def observe_exec(result: ExecResult) -> None:
    """Count a session command the current request ran (a no-op in an app without metrics)."""
    metrics = current_app.extensions.get(EXTENSION)
    if metrics is not None:
        metrics.observe_exec(result)


@blueprint.get("/metrics")
def exposition() -> Response:
    metrics: ExecutorMetrics = current_app.extensions[EXTENSION]
    return Response(metrics.exposition(), mimetype=None, content_type=CONTENT_TYPE_LATEST)
