"""Is the fleet usable at all? Checked before ``dockyard grade`` sends its first task, and again
after the first grading of every repository, so a wrong token, a dead fleet or a wrong
``--repo-root`` stops the run at once with its reason instead of grading every instance into
``error``.

* before: every executor's ``/health`` (no auth) and one authenticated call: none answering, or
  one refusing the token, is ``FleetUnusable``; some not answering is a warning (the client
  routes around them);
* the scouts: the first instance of each repository is graded before the others; when none of
  them got a verdict and all failed for a reason the rest would share (``unknown_repo``,
  ``unauthorized``, ``executor_unreachable``), the run stops there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ..client import SandboxClient
from ..errors import ExecutorRejected, TaskExecutorError

FLEET_CODES = frozenset({"unknown_repo", "unauthorized", "executor_unreachable"})
"""Error codes that say the run cannot work, not that one instance is broken."""

HINTS = {
    "unknown_repo": "check --repo-root / --repo-url-template (the path or URL the executors get)",
    "unauthorized": "pass the executors' token with --token or DOCKYARD_API_TOKEN",
    "executor_unreachable": "check --urls / DOCKYARD_SANDBOX_URLS and that the executors run",
}


class FleetUnusable(Exception):
    """The run cannot produce verdicts; the message says why and what to check."""


def check_fleet(client: SandboxClient) -> list[str]:
    """Raise ``FleetUnusable`` when no executor answers or one refuses the token; return
    warnings about executors that do not answer while others do."""
    down: list[str] = []
    refused: list[str] = []
    for url in client.urls:
        try:
            client.health(url)
        except TaskExecutorError as exc:
            down.append(f"{url}: {exc.message}")
            continue
        try:
            client.check_token(url)
        except ExecutorRejected as exc:
            if exc.status != 401:
                raise
            refused.append(f"{url}: {exc.message}")
        except TaskExecutorError as exc:
            down.append(f"{url}: {exc.message}")
    if refused:
        raise FleetUnusable(
            f"{len(refused)} of {len(client.urls)} executors refused the token (401 "
            f"unauthorized): {'; '.join(refused)}; {HINTS['unauthorized']}"
        )
    if len(down) == len(client.urls):
        raise FleetUnusable(
            f"no executor reachable: {'; '.join(down)}; {HINTS['executor_unreachable']}"
        )
    return [f"warning: executor not answering (routed around): {line}" for line in down]


def scouts(predictions: Iterable[Any], instances: Mapping[str, Mapping[str, Any]]) -> list[Any]:
    """The first prediction of each repository, in order."""
    seen: dict[str, Any] = {}
    for prediction in predictions:
        seen.setdefault(str(instances[prediction.instance_id].get("repo")), prediction)
    return list(seen.values())


def judge_scouts(entries: list[dict[str, Any]]) -> None:
    """``FleetUnusable`` when no scout got a verdict and all failed for a fleet-wide reason."""
    if not entries or any(e.get("category") != "error" for e in entries):
        return
    codes = Counter(e.get("error_code") for e in entries)
    if set(codes) <= FLEET_CODES:
        code, _ = codes.most_common(1)[0]
        what = {"unknown_repo": "every instance's repository is unknown to the executors"}.get(
            code, f"the first grading of every repository failed ({code})"
        )
        example = str(entries[0].get("error") or "")[:300]
        raise FleetUnusable(f"{what}: {example}; {HINTS[str(code)]}")
