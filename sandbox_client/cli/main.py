"""The ``dockyard`` command: grade SWE-bench predictions, preflight instances, run a local fleet.

Exit status: 0 all done with a verdict for everything; 1 done, but some instances ended without a
verdict (grade), were flagged or errored (preflight), or the fleet failed; 2 bad usage, input
files, or a fleet that cannot grade (no executor reachable, the token refused, every repository
unknown); 130 interrupted (a second Ctrl-C abandons the tasks in flight at once, quietly).
Executor URLs and token come from ``--urls`` / ``--token``, else ``DOCKYARD_SANDBOX_URLS`` /
``DOCKYARD_API_TOKEN``, else ``http://127.0.0.1:9090``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from ..client import SandboxClient
from ..config import resolve_config
from ..version import dockyard_version
from .fleet import fleet_reap, fleet_up
from .fleetcheck import FleetUnusable, check_fleet
from .grade import grade_predictions
from .logdir import InstanceLogs
from .preflight import VERDICTS, run_preflight
from .report import GradeReport, write_json_atomic
from .specs import RepoSpecs
from .swebench import (
    GOLD,
    InputError,
    RepoMapper,
    gold_predictions,
    load_instances,
    load_predictions,
    select_instances,
)

DEFAULT_REPORT = "dockyard_report.json"
WORKERS_PER_EXECUTOR = 4
FULL_LOG_BYTES = 16 * 1024**2
"""What ``dockyard grade`` asks each result's log to hold (the executors' default cap)."""


def _add_grading_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instances",
        required=True,
        type=Path,
        help="SWE-bench instances (JSON list, JSON object or JSON Lines)",
    )
    parser.add_argument("--urls", help="comma-separated executor URLs (DOCKYARD_SANDBOX_URLS)")
    parser.add_argument("--token", help="executor bearer token (DOCKYARD_API_TOKEN)")
    parser.add_argument(
        "--workers", type=int, help=f"tasks in flight (default {WORKERS_PER_EXECUTOR} per executor)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="wall clock per task in seconds, for "
        "instances that set none (default: the executor's)",
    )
    parser.add_argument(
        "--max-error-retries",
        type=int,
        default=2,
        metavar="K",
        help="re-send a task that got no verdict up to K times (default 2)",
    )
    repos = parser.add_mutually_exclusive_group()
    repos.add_argument(
        "--repo-root",
        type=Path,
        metavar="DIR",
        help="map repo 'owner/name' to the local clone DIR/owner/name",
    )
    repos.add_argument(
        "--repo-url-template",
        metavar="TEMPLATE",
        help="map repo 'owner/name' with {repo}, {owner}, {name}, e.g. "
        "'https://github.com/{repo}.git'",
    )
    parser.add_argument(
        "--instance-ids", nargs="+", metavar="ID", help="only these instances (default: all)"
    )
    parser.add_argument(
        "--specs",
        type=Path,
        metavar="FILE",
        help="setup, test_command, log_parser, env per repository and version (JSON; the "
        "instances' own fields win)",
    )
    parser.add_argument(
        "--rules",
        choices=("strict", "swebench"),
        default="strict",
        help="verdict rules: strict (default: every required test PASSED) or swebench (the "
        "SWE-bench harness's: skipped PASS_TO_PASS maintained, XFAIL passes, apply failures "
        "and timeouts are errors)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every retry")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dockyard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"dockyard {dockyard_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    grade = commands.add_parser("grade", help="grade SWE-bench predictions into a report")
    _add_grading_options(grade)
    grade.add_argument(
        "--predictions",
        required=True,
        help="predictions file (instance_id, model_patch, model_name_or_path), or 'gold': "
        "each instance's own patch",
    )
    grade.add_argument(
        "--output",
        type=Path,
        default=Path(DEFAULT_REPORT),
        help=f"report file; rerunning with it resumes (default {DEFAULT_REPORT})",
    )
    grade.add_argument(
        "--run-id", help="names the log directory's run (default: the report's file name stem)"
    )
    grade.add_argument(
        "--log-dir",
        type=Path,
        help="per-instance logs in LOG_DIR/RUN_ID/MODEL/INSTANCE_ID/ (default: logs/ beside "
        "the report)",
    )

    preflight = commands.add_parser(
        "preflight", help="flag vacuous and flaky instances; write an allowlist"
    )
    _add_grading_options(preflight)
    preflight.add_argument(
        "--repeat", type=int, default=2, metavar="K", help="gradings of each patch (default 2)"
    )
    preflight.add_argument(
        "--allowlist",
        type=Path,
        default=Path("allowlist.txt"),
        help="file of instance ids that passed (default allowlist.txt)",
    )
    preflight.add_argument("--output", type=Path, help="also write the findings as JSON here")

    fleet = commands.add_parser("fleet", help="executors on this machine or a cluster")
    actions = fleet.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="run N executors here until Ctrl-C")
    up.add_argument("--workers", type=int, required=True, help="number of executors")
    up.add_argument(
        "--base-port",
        type=int,
        default=9090,
        help="port of the first executor, the next get +1 ... (0: any free ports)",
    )
    up.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    up.add_argument(
        "--base-dir",
        type=Path,
        help="working dirs and logs, kept between runs (default: $XDG_CACHE_HOME/dockyard/fleet, "
        "else ~/.cache/dockyard/fleet; /var/cache/dockyard/fleet for root with a closed home)",
    )
    up.add_argument("--token", help="bearer token the executors require")
    up.add_argument("--threads", type=int, help="threads per executor")
    up.add_argument("--startup-timeout", type=float, default=60.0)
    reap = actions.add_parser("reap", help="delete a job's executor pods (needs [k8s])")
    reap.add_argument("--job", required=True, help="job id the pods were created for")
    reap.add_argument("--namespace", help="Kubernetes namespace")
    return parser


def _abandon(signum: int, frame: FrameType | None) -> None:
    """The second Ctrl-C: leave now, without waiting for the tasks in flight (the report on disk
    is whole: it is replaced atomically) and without a traceback from the threads."""
    sys.stderr.write("dockyard: abandoned the tasks in flight\n")
    sys.stderr.flush()
    os._exit(130)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C: as Python's own (KeyboardInterrupt), and from now on the next one
    abandons (it may come while the tasks in flight are still being waited for, even after
    ``main`` returned and the interpreter joins the worker threads)."""
    signal.signal(signal.SIGINT, _abandon)
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _interrupt)
    try:
        return _run(args)
    finally:
        # Not interrupted: as before. Interrupted: _abandon stays for the threads' join.
        if previous is not None and signal.getsignal(signal.SIGINT) is _interrupt:
            signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "fleet":
            if args.action == "up":
                return fleet_up(
                    workers=args.workers,
                    base_port=args.base_port,
                    host=args.host,
                    base_dir=args.base_dir,
                    token=args.token,
                    threads=args.threads,
                    startup_timeout=args.startup_timeout,
                )
            return fleet_reap(args.job, namespace=args.namespace)
        if args.command == "grade":
            return _grade(args)
        return _preflight(args)
    except (InputError, FleetUnusable) as exc:
        print(f"dockyard {args.command}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # bad URLs and similar configuration errors
        print(f"dockyard {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\ndockyard {args.command}: interrupted; tasks in flight finish and are saved "
            "(Ctrl-C again to abandon them)",
            file=sys.stderr,
            flush=True,
        )
        return 130


def _client(args: argparse.Namespace) -> tuple[SandboxClient, int]:
    # Validate before building the client: a refused option must not leave an open client behind.
    config = resolve_config(urls=args.urls, token=args.token)
    workers = args.workers or WORKERS_PER_EXECUTOR * len(config.urls)
    if workers < 1:
        raise InputError("--workers must be at least 1")
    if args.max_error_retries < 0:
        raise InputError("--max-error-retries must not be negative")
    return SandboxClient(config=config), workers


def _instances(args: argparse.Namespace) -> dict[str, dict]:
    """The instances to work on: loaded, narrowed to --instance-ids, filled from --specs."""
    instances = select_instances(load_instances(args.instances), args.instance_ids)
    specs = RepoSpecs.load(args.specs)
    return {iid: specs.fill(instance) for iid, instance in instances.items()}


def _grade(args: argparse.Namespace) -> int:
    instances = _instances(args)
    if args.predictions == GOLD:
        predictions = gold_predictions(instances)
    else:
        everything = load_instances(args.instances)  # predictions may name any instance
        loaded = load_predictions(Path(args.predictions), everything)
        predictions = {iid: p for iid, p in loaded.items() if iid in instances}
        if not predictions:
            raise InputError(f"{args.predictions}: no predictions for the selected instances")
    repos = RepoMapper(args.repo_root, args.repo_url_template)
    run_id = args.run_id or args.output.stem
    log_dir = args.log_dir if args.log_dir is not None else args.output.parent / "logs"
    client, workers = _client(args)
    with client:
        report = GradeReport(args.output, instances, predictions, client.urls,
                             run={"run_id": run_id, "log_dir": str(log_dir)})

        sent: list[bool] = []  # the fleet check passed: tasks go out, errors are this run's

        def check() -> None:
            for warning in check_fleet(client):
                print(f"dockyard grade: {warning}", file=sys.stderr)
            sent.append(True)

        try:
            grade_predictions(
                client,
                instances,
                predictions,
                report,
                repos=repos,
                workers=workers,
                max_error_retries=args.max_error_retries,
                timeout=args.timeout,
                logs=InstanceLogs(log_dir, run_id),
                log_bytes=FULL_LOG_BYTES,
                before_sending=check,
                rules=args.rules,
            )
        finally:
            if sent:
                _print_errors(report)
    s = report.summary()
    share = 100.0 * s["resolved_instances"] / max(1, s["submitted_instances"])
    print(
        f"resolved {s['resolved_instances']}/{s['submitted_instances']} ({share:.1f}%), "
        f"unresolved {s['unresolved_instances']}, empty patch {s['empty_patch_instances']}, "
        f"error {s['error_instances']} -> {args.output} (logs: {log_dir / run_id})"
    )
    return 1 if s["error_instances"] else 0


def _print_errors(report: GradeReport) -> None:
    """One line per reason the run's errors had, with an example, on stderr."""
    for code, count in sorted(report.error_reasons().items(), key=lambda kv: -kv[1]):
        iid, error = report.example_error(code)
        example = f" (e.g. {iid}: {error.splitlines()[0][:200]})" if error else ""
        print(f"error {code}: {count}{example}", file=sys.stderr)


def _preflight(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        raise InputError("--repeat must be at least 1")
    instances = _instances(args)
    repos = RepoMapper(args.repo_root, args.repo_url_template)
    client, workers = _client(args)
    with client:

        def check() -> None:
            for warning in check_fleet(client):
                print(f"dockyard preflight: {warning}", file=sys.stderr)

        checks = run_preflight(
            client,
            instances,
            repos=repos,
            repeat=args.repeat,
            workers=workers,
            max_error_retries=args.max_error_retries,
            timeout=args.timeout,
            rules=args.rules,
            before_sending=check,
        )
    allowed = [c.instance_id for c in checks if c.verdict == "ok"]
    args.allowlist.parent.mkdir(parents=True, exist_ok=True)
    args.allowlist.write_text("".join(f"{iid}\n" for iid in allowed), encoding="utf-8")
    for check in checks:
        if check.verdict != "ok":
            detail = ", ".join(check.flags) or "; ".join(check.errors[:2])
            tests = f" (tests: {', '.join(check.flaky_tests[:5])})" if check.flaky_tests else ""
            print(
                f"{check.verdict.upper():8} {check.instance_id}: {detail}{tests}; "
                f"reference {check.reference}, empty {check.empty}"
            )
    counts = {v: sum(c.verdict == v for c in checks) for v in VERDICTS}
    print(
        f"preflight: {counts['ok']} ok, {counts['vacuous']} vacuous, {counts['flaky']} flaky, "
        f"{counts['error']} error -> allowlist {args.allowlist}"
    )
    if args.output:
        write_json_atomic(
            args.output,
            {"repeat": args.repeat, "counts": counts, "instances": [c.to_json() for c in checks]},
        )
    return 0 if counts["ok"] == len(checks) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
