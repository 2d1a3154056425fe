"""``task-executor serve``: the executor's entry point (also ``python -m task_executor``)."""

from __future__ import annotations

import argparse
import gc
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Callable, Sequence

# Only light imports up here: the process makes itself non-dumpable first thing in main(), and
# everything imported before that is start-up time during which it is not (see hardening).
from task_executor import __version__, hardening
from task_executor.config import Settings, settings_from_env

log = logging.getLogger("task_executor")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="task-executor", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the REST API with waitress")
    serve.add_argument("--host", help="bind address (API_HOST, default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="port (API_PORT, default 9090; 0 picks one)")
    serve.add_argument(
        "--threads", type=int, help="worker threads (DOCKYARD_TASK_EXECUTOR_THREADS)"
    )
    serve.add_argument("--base-dir", help="working directory (TASK_BASE_DIR)")
    serve.add_argument(
        "--token",
        help="bearer token required by every route but /health (API_TOKEN); moved out of argv "
        "and the environment at start",
    )
    serve.add_argument(
        "--token-file",
        help="read the token from this file, one trailing newline stripped (API_TOKEN_FILE)",
    )
    serve.add_argument(
        "--image", metavar="REF",
        help="the task image this executor runs (DOCKYARD_IMAGE); needs --image-root",
    )
    serve.add_argument(
        "--image-root", metavar="DIR",
        help="that image's unpacked root filesystem, every sandbox's root, read-only "
        "(DOCKYARD_IMAGE_ROOT); needs --image",
    )
    # Internal: the re-exec'd image reads the token from this inherited pipe (see hardening).
    serve.add_argument("--token-fd", type=int, help=argparse.SUPPRESS)
    return parser


_TOKEN_ARGS = ("token", "token_file", "token_fd")


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """The log, readable by root alone (0600, rotated files too): it names every task and
    session, and a sandbox uid that can pass the base dir (to resolve its binds) must not read
    them, nor may a co-hosted executor's."""

    def _open(self):  # type: ignore[no-untyped-def]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        os.fchmod(fd, 0o600)  # a file an earlier version made 0644
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def configure_logging(settings: Settings) -> None:
    from task_executor.service.requestlog import RequestIdFilter  # Flask: not before main()

    settings.base_dir.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(threadName)s [%(request_id)s] %(message)s"
    )
    request_ids = RequestIdFilter()
    file_handler = _PrivateRotatingFileHandler(
        settings.base_dir / "task_executor.log", maxBytes=50 * 1024 * 1024, backupCount=3
    )
    stream_handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (file_handler, stream_handler):
        handler.setFormatter(formatter)
        handler.addFilter(request_ids)
        root.addHandler(handler)


def serve(settings: Settings, private_mounts: bool = False) -> None:
    """Serve until stopped; with ``private_mounts`` (the process's own entry point, still
    single-threaded) in a mount namespace of the executor's own (see executor_namespace)."""
    from task_executor.sandbox import executor_namespace
    from task_executor.service import lifecycle
    from task_executor.service.app import create_app
    from task_executor.service.limits import raise_open_files_limit
    from task_executor.service.server import make_server

    stop_with_parent()
    # Before the app exists: what a killed predecessor left must be gone before work starts.
    # Still in the host's namespace, where a predecessor that had none left its mounts.
    base_dir_lock = lifecycle.take_over_base_dir(settings)
    log.info("open files: up to %d", raise_open_files_limit())
    if private_mounts:  # before the app starts any thread, and before it mounts anything
        entered = executor_namespace.enter_private()
        if entered.private:
            log.info("mounts: in a private mount namespace (invisible to the host and to "
                     "other executors)")
        else:
            log.warning("mounts: in the host's mount namespace: %s", entered.reason)
    app = create_app(settings)
    server = make_server(app, settings)
    # What exists now lives as long as the process (modules, the app, its services): out of
    # every later garbage collection. A full one stops every thread, and went through these
    # 57,000 objects each time (scripts/bench/bench_gc.py: 20 ms -> 2.7 ms at 500 sessions).
    gc.freeze()
    # Printed (and flushed) so scripts that start us on port 0 can learn the real port.
    print(
        f"task-executor {__version__} listening on http://{server.effective_host}:"
        f"{server.effective_port}",
        flush=True,
    )
    log.info(
        "serving on %s:%s with %d threads: %d for gradings, %d for long session calls, %d kept "
        "for /health and short calls",
        server.effective_host,
        server.effective_port,
        settings.threads,
        settings.max_tasks,
        settings.max_execs,
        settings.threads - settings.max_tasks - settings.max_execs,
    )
    lifecycle.serve_until_stopped(server, app)
    base_dir_lock.close()


STOP_WITH_PARENT_VAR = "DOCKYARD_STOP_WITH_PARENT"


def stop_with_parent() -> None:
    """With ``DOCKYARD_STOP_WITH_PARENT=<pid>`` (``dockyard fleet up`` sets it for its workers),
    the kernel sends this process SIGTERM when that parent dies, however it dies: a fleet killed
    with SIGKILL left its executors serving, orphaned. Linux only; elsewhere ignored."""
    parent = os.environ.pop(STOP_WITH_PARENT_VAR, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the prctl: nobody will send the signal
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI. With ``argv`` None this is the process's own entry point (the console
    script, ``python -m task_executor``): the process makes itself non-dumpable, when the
    token came in argv or the environment re-execs itself without it (see
    :mod:`task_executor.hardening`), and serves from a mount namespace of its own (see
    :mod:`task_executor.sandbox.executor_namespace`). With an explicit ``argv`` (tests,
    embedding) it does none of these.
    """
    entry_point = argv is None
    dumpable = hardening.make_undumpable() if entry_point else None  # before any token is read
    parser = _parser()
    args = parser.parse_args(argv)
    token_args = {name: getattr(args, name, None) for name in _TOKEN_ARGS}
    try:
        source = hardening.choose_source(**token_args, environ=os.environ)
        if entry_point and hardening.needs_reexec(args.token, args.token_fd, os.environ):
            hardening.reexec_without_token(
                sys.argv[1:], source, os.environ, check=_same_flags_check(parser, args)
            )
        token = hardening.load_token(source)
        settings = settings_from_env().with_overrides(
            host=args.host,
            port=args.port,
            threads=args.threads,
            base_dir=args.base_dir,
            token=token,
            image=args.image,
            image_root=args.image_root,
        )
    except ValueError as exc:
        print(f"task-executor: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the re-exec itself failed: never serve with the token on show
        print(f"task-executor: cannot re-exec to hide the token: {exc}", file=sys.stderr)
        return 2
    if source is not None and source.kind == "file" and settings.sandbox_mode != "none":
        from task_executor.service.services import executor_paths

        exposed = hardening.token_file_exposure(
            source.path, [str(settings.base_dir), *settings.hide_paths, *executor_paths()])
        if exposed is not None:
            print(f"task-executor: {exposed}", file=sys.stderr)
            return 2
    configure_logging(settings)
    if dumpable is not None:
        (log.info if dumpable[0] else log.warning)("%s", dumpable[1])
    log.info(
        "auth: %s",
        f"bearer token required (from {source.origin})" if source else "none (no token set)",
    )
    from task_executor.service.lifecycle import BaseDirInUse, ServingLoopFailed
    from task_executor.service.services import SandboxUnavailable

    try:
        serve(settings, private_mounts=entry_point)
    except (BaseDirInUse, SandboxUnavailable) as exc:
        print(f"task-executor: {exc}", file=sys.stderr)
        return 2
    except ServingLoopFailed as exc:  # already logged with its traceback
        print(f"task-executor: {exc}", file=sys.stderr)
        if entry_point:
            # At once: worker threads still running must not hold the exit, and the next
            # executor on the base directory cleans up whatever this one leaves.
            logging.shutdown()
            os._exit(1)
        return 1
    return 0


def _same_flags_check(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> Callable[[list[str]], None]:
    """A check that the re-exec'd image's arguments parse to the same flags but the token's."""

    def check(new_args: list[str]) -> None:
        again = parser.parse_args(new_args)
        before = {k: v for k, v in vars(args).items() if k not in _TOKEN_ARGS}
        after = {k: v for k, v in vars(again).items() if k not in _TOKEN_ARGS}
        if before != after or again.token is not None:
            raise hardening.TokenError(
                "re-exec would change flags other than the token; refusing (use --token-file)"
            )

    return check
