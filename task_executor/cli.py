"""``task-executor serve``: the executor's entry point (also ``python -m task_executor``)."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys
from collections.abc import Sequence

from task_executor import __version__
from task_executor.config import Settings, settings_from_env
from task_executor.service.requestlog import RequestIdFilter

log = logging.getLogger("task_executor")

# Waitress threads beyond the grading capacity, so /health and light calls are never starved.
_WAITRESS_SPARE_THREADS = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="task-executor", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the REST API with waitress")
    serve.add_argument("--host", help="bind address (API_HOST, default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="port (API_PORT, default 9090; 0 picks one)")
    serve.add_argument(
        "--threads", type=int, help="worker threads (DOCKYARD_TASK_EXECUTOR_THREADS)"
    )
    serve.add_argument("--base-dir", help="working directory (TASK_BASE_DIR)")
    serve.add_argument(
        "--token", help="bearer token required by every route but /health (API_TOKEN)"
    )
    return parser


def configure_logging(settings: Settings) -> None:
    settings.base_dir.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(threadName)s [%(request_id)s] %(message)s"
    )
    request_ids = RequestIdFilter()
    file_handler = logging.handlers.RotatingFileHandler(
        settings.base_dir / "task_executor.log", maxBytes=50 * 1024 * 1024, backupCount=3
    )
    stream_handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (file_handler, stream_handler):
        handler.setFormatter(formatter)
        handler.addFilter(request_ids)
        root.addHandler(handler)


def serve(settings: Settings) -> None:
    from task_executor.service import lifecycle
    from task_executor.service.app import create_app
    from task_executor.service.server import make_server

    # Before the app exists: what a killed predecessor left must be gone before work starts.
    base_dir_lock = lifecycle.take_over_base_dir(settings)
    app = create_app(settings)
    server = make_server(app, settings)
    # Printed (and flushed) so scripts that start us on port 0 can learn the real port.
    print(
        f"task-executor {__version__} listening on http://{server.effective_host}:"
        f"{server.effective_port}",
        flush=True,
    )
    log.info(
        "serving on %s:%s with %d threads, grading capacity %d",
        server.effective_host,
        server.effective_port,
        settings.threads,
        settings.max_tasks,
    )
    lifecycle.serve_until_stopped(server, app)
    base_dir_lock.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = settings_from_env().with_overrides(
            host=args.host,
            port=args.port,
            threads=args.threads,
            base_dir=args.base_dir,
            token=args.token,
        )
    except ValueError as exc:
        print(f"task-executor: invalid configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    from task_executor.service.lifecycle import BaseDirInUse

    try:
        serve(settings)
    except BaseDirInUse as exc:
        print(f"task-executor: {exc}", file=sys.stderr)
        return 2
    return 0
