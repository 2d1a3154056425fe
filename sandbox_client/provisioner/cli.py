"""``dockyard-provision``: provision a job's executor pods, reap a job, or render ``k8s/``.

    dockyard-provision provision --job run-42 --count 8      # prints URLs, drains on SIGTERM/^C
    dockyard-provision reap --job run-42                     # deletes every pod of the job
    dockyard-provision manifests --write k8s                 # regenerates the kustomize base
    dockyard-provision manifests --check k8s                 # exit 1 if k8s/ is stale

Settings come from the environment (:meth:`ProvisionerSettings.from_env`); flags override them.
``dockyard fleet reap --job ID`` calls :func:`.reaper.reap` directly, not :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..version import dockyard_version
from .config import ProvisionerSettings
from .errors import ProvisionerError, ReadinessTimeout
from .manifests import kustomize_files, render_yaml

log = logging.getLogger(__name__)


def _api_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", required=True, help="job id (the dockyard.io/job label)")
    parser.add_argument("--namespace", help="namespace (default: $DOCKYARD_K8S_NAMESPACE)")
    parser.add_argument("--api-host", help="Kubernetes API URL (default: in-cluster/kubeconfig)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dockyard-provision", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version",
                        version=f"dockyard-provision {dockyard_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    prov = sub.add_parser("provision", help="create executor pods and hold them until signalled")
    _api_flags(prov)
    prov.add_argument("--count", type=int, required=True)
    prov.add_argument("--min-ready", type=int, help="fewest Ready pods to accept (default: all)")
    prov.add_argument("--image", help="executor image (task image with --carrier-image)")
    prov.add_argument("--carrier-image", help="carrier image that injects the executor")
    prov.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=None,
                      help="let the executor sandbox code under test (root, SYS_ADMIN, "
                           "unconfined seccomp/AppArmor; default: $DOCKYARD_POD_SANDBOX, off)")
    prov.add_argument("--max-live", type=int, help="cap on live pods")
    prov.add_argument("--rate", type=float, help="creates per second")
    prov.add_argument("--burst", type=int, help="token-bucket burst")
    prov.add_argument("--jitter", type=float, help="extra random delay per create, seconds")
    prov.add_argument("--ready-timeout", type=float, help="readiness budget, seconds")
    prov.add_argument("--json", action="store_true", help="print the URLs as one JSON list")
    prov.add_argument("--detach", action="store_true",
                      help="exit leaving the pods (owned, labelled) for a later reap")

    reap_cmd = sub.add_parser("reap", help="delete every pod labelled with a job id")
    _api_flags(reap_cmd)
    reap_cmd.add_argument("--timeout", type=float, default=300.0)

    man = sub.add_parser("manifests", help="write or check the generated k8s/ files")
    group = man.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="DIR", help="write the files into DIR")
    group.add_argument("--check", metavar="DIR", help="exit 1 if DIR's files differ")
    return parser


def settings_from_args(args: argparse.Namespace,
                       env: dict[str, str] | None = None) -> ProvisionerSettings:
    """Environment first, then flags: the one place the CLI turns input into settings."""
    base = ProvisionerSettings.from_env(env, job=args.job)
    changes: dict[str, Any] = {}
    if args.namespace:
        changes["namespace"] = args.namespace
    if args.api_host:
        changes["api"] = replace(base.api, host=args.api_host)
    pod_changes: dict[str, Any] = {key: value for key, value in (
        ("image", getattr(args, "image", None)),
        ("carrier_image", getattr(args, "carrier_image", None))) if value}
    if getattr(args, "sandbox", None) is not None:
        pod_changes["sandbox"] = args.sandbox
    if pod_changes:
        changes["pod"] = replace(base.pod, **pod_changes)
    for flag, field_name in (("max_live", "max_live"), ("rate", "rate"), ("burst", "burst"),
                             ("jitter", "jitter_s"), ("ready_timeout", "readiness_timeout_s")):
        value = getattr(args, flag, None)
        if value is not None:
            changes[field_name] = value
    return base.with_changes(**changes)


def _provision(args: argparse.Namespace) -> int:
    from .provisioner import Provisioner

    settings = settings_from_args(args)
    with Provisioner(settings) as fleet:
        try:
            urls = fleet.provision(args.count, min_ready=args.min_ready)
        except ReadinessTimeout as exc:
            log.error("%s", exc)
            return 3
        print(json.dumps(urls) if args.json else "\n".join(urls), flush=True)
        if args.detach:
            fleet.detach()
            print(f"detached; remove with: dockyard-provision reap --job {args.job}",
                  file=sys.stderr)
            return 0
        # Hold the pods until SIGTERM/SIGINT, which unwinds through the drain. Wake up now and
        # then: the kernel may deliver the signal to a worker thread, and Python runs handlers
        # only when the main thread gets back to its loop (an endless wait would never return).
        forever = threading.Event()
        while not forever.wait(0.2):
            pass
    return 0  # pragma: no cover - the wait above ends only by a signal


def _reap(args: argparse.Namespace) -> int:
    from .api import PodAPI
    from .reaper import reap

    settings = settings_from_args(args)
    with PodAPI(settings.api, settings.namespace) as api:
        report = reap(settings.job, settings.namespace, api=api, timeout_s=args.timeout)
    print(f"job {settings.job}: {report.deleted} pods deleted, {report.left} left")
    return 0 if report.left == 0 else 1


def _manifests(args: argparse.Namespace) -> int:
    files = {name: render_yaml(objs) for name, objs in kustomize_files().items()}
    if args.write:
        out = Path(args.write)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
        return 0
    stale = [name for name, text in files.items()
             if not (Path(args.check) / name).is_file()
             or (Path(args.check) / name).read_text() != text]
    for name in stale:
        print(f"{Path(args.check) / name} differs from manifests.py; run "
              f"dockyard-provision manifests --write {args.check}", file=sys.stderr)
    return 1 if stale else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dockyard-provision``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if args.command == "provision":
            return _provision(args)
        if args.command == "reap":
            return _reap(args)
        return _manifests(args)
    except (ProvisionerError, ValueError) as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
