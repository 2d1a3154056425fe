"""Client settings: where the executors are, how long to wait, how hard to retry.

``resolve_config`` is the one place that reads the environment. Executor URLs come from, in order:
the ``urls`` argument; a trainer config's ``env.code.sandbox_urls`` (nested dicts, OmegaConf
``DictConfig`` or any attribute-style object such as ``SimpleNamespace``); the
``DOCKYARD_SANDBOX_URLS`` environment variable (comma-separated); ``http://127.0.0.1:9090``.
The token comes from the argument, else ``DOCKYARD_API_TOKEN``. The trainer config's
``env.code.task_timeout`` becomes the wall clock sent with tasks that do not set their own.
How work is dealt (``affinity``, the default, or ``round_robin``) and over how many executors a
template may live come from the arguments, else ``env.code.routing`` / ``env.code.affinity_k``,
else ``DOCKYARD_ROUTING``. The conditions every task and session must run under (unless it declares
its own) come from the ``conditions`` argument, else ``env.code.conditions``, else
``DOCKYARD_CONDITIONS`` (a JSON object).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

import pydantic

from .errors import InvalidConfig, first_problem
from .protocol import GradingSpec, RequiredConditions, SessionStartSpec, TaskSpec

DEFAULT_URL = "http://127.0.0.1:9090"
URLS_ENV = "DOCKYARD_SANDBOX_URLS"
TOKEN_ENV = "DOCKYARD_API_TOKEN"
ROUTING_ENV = "DOCKYARD_ROUTING"
CONDITIONS_ENV = "DOCKYARD_CONDITIONS"

Routing = Literal["affinity", "round_robin"]
"""``affinity``: a template's tasks and sessions go to the executors its key ranks first
(rendezvous hashing); ``round_robin``: each to the next executor in turn."""

Timeout = float | tuple[float, float]
G = TypeVar("G", bound="GradingSpec")
C = TypeVar("C", "TaskSpec", "SessionStartSpec")


@dataclass(frozen=True)
class ClientConfig:
    """Everything a ``SandboxClient`` needs; immutable so threads can share it freely."""

    urls: tuple[str, ...] = (DEFAULT_URL,)
    token: str | None = field(default=None, repr=False)
    #: Seconds to wait for a TCP connection; past it the executor counts as unreachable.
    connect_timeout: float = 5.0
    #: Read timeout of calls that run nothing long (state, files, reset, delete, health).
    read_timeout: float = 60.0
    #: Wall clock sent with tasks (and finishes) that set none; None leaves the executor's default.
    task_timeout: float | None = None
    #: What a read may wait for when neither the call nor this config names a wall clock: the
    #: executor then applies its own default, which the client cannot see.
    fallback_run_s: float = 1800.0
    #: Added to a task's or command's own wall clock to get the read timeout of the call that
    #: runs it (covers checkout, setup, patching and the reply itself).
    timeout_margin: float = 120.0
    #: 429/503 answers retried per call, and the seconds all those waits may add up to.
    busy_retries: int = 8
    busy_budget_s: float = 600.0
    #: Exponential backoff between busy retries (the executor's Retry-After is a floor).
    backoff_base_s: float = 0.5
    backoff_max_s: float = 60.0
    #: Same-task_id re-submits to the same executor after a lost reply.
    resubmits: int = 2
    #: Pooled connections kept per executor (more are opened under load, then dropped).
    pool_maxsize: int = 64
    #: How tasks and new sessions are dealt over the executors (see ``Routing``).
    routing: Routing = "affinity"
    #: Executors a template lives on under affinity routing: its first ``affinity_k`` in rank,
    #: the least busy of them taking each task; beyond them only when they are full.
    affinity_k: int = 1
    #: An ejected executor (its connect failed) is probed with ``GET /health`` after a jittered
    #: backoff from ``probe_base_s`` doubling up to ``probe_max_s``, until it answers.
    probe_base_s: float = 0.5
    probe_max_s: float = 30.0
    #: Read timeout of those probes (``/health`` answers within about 2 s when it can).
    probe_read_timeout: float = 10.0
    #: Conditions every task and session must run under unless it declares its own; an executor
    #: that cannot give them answers 409 ``conditions_mismatch`` and the call moves on.
    conditions: RequiredConditions | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise InvalidConfig("ClientConfig needs at least one executor URL")
        if self.routing not in get_args(Routing):
            raise InvalidConfig(f"routing must be one of {get_args(Routing)}, got {self.routing!r}")
        if self.affinity_k < 1:
            raise InvalidConfig(f"affinity_k must be at least 1, got {self.affinity_k}")
        object.__setattr__(self, "urls", tuple(normalize_url(u) for u in self.urls))

    def run_read_timeout(self, run_s: float | None) -> float:
        """Read timeout for a call that runs something for up to ``run_s`` seconds."""
        budget = run_s if run_s is not None else (self.task_timeout or self.fallback_run_s)
        return budget + self.timeout_margin

    def with_conditions(self, spec: C) -> C:
        """``spec`` declaring this config's conditions when it declares none."""
        if spec.conditions is None and self.conditions is not None:
            return spec.model_copy(update={"conditions": self.conditions})
        return spec

    def with_task_timeout(self, spec: G) -> G:
        """``spec`` with ``task_timeout`` as its wall clock when it sets none (tasks and finishes
        alike), so the executor and the read timeout agree on the same budget."""
        if spec.timeout is None and self.task_timeout is not None:
            return spec.model_copy(update={"timeout": self.task_timeout})
        return spec


def normalize_url(url: str) -> str:
    """Strip blanks and trailing slashes; refuse anything that is not an http(s) base URL."""
    cleaned = url.strip().rstrip("/")
    parts = urlsplit(cleaned)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidConfig(f"executor URL must look like http://host:port, got {url!r}")
    return cleaned


def parse_urls(value: str | Iterable[str]) -> tuple[str, ...]:
    """Accept a comma-separated string or any iterable of strings (list, tuple, ListConfig)."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return tuple(normalize_url(item) for item in items if item.strip())


def lookup(config: Any, dotted: str) -> Any:
    """Read ``a.b.c`` from nested mappings or attribute objects; None when any step is missing."""
    node = config
    for key in dotted.split("."):
        if node is None:
            return None
        if isinstance(node, Mapping):
            node = node.get(key)
        else:
            node = getattr(node, key, None)
    return node


def resolve_config(
    urls: str | Iterable[str] | None = None,
    token: str | None = None,
    timeout: Timeout | None = None,
    config: Any = None,
    *,
    task_timeout: float | None = None,
    routing: str | None = None,
    affinity_k: int | None = None,
    conditions: RequiredConditions | Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientConfig:
    """Build a ``ClientConfig`` from arguments, a trainer config and the environment.

    ``timeout`` sets the network timeouts of short calls: a float is the read timeout, a
    ``(connect, read)`` tuple sets both. ``config`` may already be a ``ClientConfig``; the other
    arguments then override its fields.
    """
    env = os.environ if environ is None else environ
    base = config if isinstance(config, ClientConfig) else None
    trainer = None if base is not None else config
    changes: dict[str, Any] = {}

    if urls is not None:
        changes["urls"] = parse_urls(urls)
    elif base is None:
        from_trainer = lookup(trainer, "env.code.sandbox_urls")
        if from_trainer:
            changes["urls"] = parse_urls(from_trainer)
        elif env.get(URLS_ENV, "").strip():
            changes["urls"] = parse_urls(env[URLS_ENV])

    if token is not None:
        changes["token"] = token
    elif base is None and env.get(TOKEN_ENV):
        changes["token"] = env[TOKEN_ENV]

    if timeout is not None:
        if isinstance(timeout, tuple):
            if len(timeout) != 2:
                raise InvalidConfig(f"timeout must be a number or (connect, read), got {timeout!r}")
            connect, read = timeout
            changes["connect_timeout"] = _number(float, connect, "timeout")
            changes["read_timeout"] = _number(float, read, "timeout")
        else:
            changes["read_timeout"] = _number(float, timeout, "timeout")

    if task_timeout is not None:
        changes["task_timeout"] = _number(float, task_timeout, "task_timeout")
    elif base is None:
        from_trainer = lookup(trainer, "env.code.task_timeout")
        if from_trainer is not None:
            changes["task_timeout"] = _number(float, from_trainer, "env.code.task_timeout")

    if routing is not None:
        changes["routing"] = routing
    elif base is None:
        from_trainer = lookup(trainer, "env.code.routing")
        if from_trainer:
            changes["routing"] = str(from_trainer)
        elif env.get(ROUTING_ENV, "").strip():
            changes["routing"] = env[ROUTING_ENV].strip()

    if affinity_k is not None:
        changes["affinity_k"] = _number(int, affinity_k, "affinity_k")
    elif base is None and lookup(trainer, "env.code.affinity_k") is not None:
        changes["affinity_k"] = _number(int, lookup(trainer, "env.code.affinity_k"),
                                        "env.code.affinity_k")

    if conditions is None and base is None:
        from_trainer = lookup(trainer, "env.code.conditions")
        if from_trainer is not None:
            conditions = {str(k): v for k, v in _items(from_trainer)}
        elif env.get(CONDITIONS_ENV, "").strip():
            try:
                conditions = json.loads(env[CONDITIONS_ENV])
            except json.JSONDecodeError as exc:
                raise InvalidConfig(f"{CONDITIONS_ENV} is not a JSON object: {exc}") from None
    if conditions is not None:
        try:
            changes["conditions"] = RequiredConditions.model_validate(conditions)
        except pydantic.ValidationError as exc:
            where, problem = first_problem(exc)
            where = "conditions" if where == "body" else f"conditions.{where}"
            raise InvalidConfig(f"{where}: {problem}") from None

    return replace(base or ClientConfig(), **changes)


N = TypeVar("N", int, float)


def _number(kind: type[N], value: Any, name: str) -> N:
    """``value`` as ``kind``, or ``InvalidConfig`` naming the setting."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{name} must be a number, got {value!r}") from None
def _items(node: Any) -> Iterable[tuple[Any, Any]]:
    """A mapping's or an attribute object's items (a trainer config's ``conditions``)."""
    if isinstance(node, Mapping):
        return node.items()
    if hasattr(node, "items"):
        return node.items()
    return vars(node).items()
