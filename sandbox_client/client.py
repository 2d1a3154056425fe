"""``SandboxClient``: protocol v1 over one pooled HTTP session, placed over a fleet.

Rules this module keeps (DESIGN.md, STYLE.md habit 4):

* Tasks and new sessions are placed by ``routing.Fleet``: by default on the executors their
  template key ranks first (so a GRPO group builds its template once), else round-robin; never on
  an executor whose connect failed (ejected until a ``/health`` probe is answered); first where
  there is room. Session calls stay with the executor that started the session.
* A call moves to another executor only when it provably never reached a server (the cause is a
  refused or timed-out connect: ``ExecutorUnreachable``) or was not taken (429/503: it spills to
  the next in rank). When every executor in rotation answered 429/503, the call waits
  (``Retry-After`` is the floor of a jittered exponential backoff) and starts again from its first
  choice, within a count and a time budget. Calls pinned to one executor wait out 429/503 there.
  An executor that answers 409 ``conditions_mismatch`` (it cannot give the conditions the call
  declares) is not asked again by that call, which moves on to the next in rank.
* Before the first call placed on an executor the client reads its ``/health`` (task and session
  capacity), so a cold batch waits in the client for room instead of being sent to meet 429s;
  that capacity is asked again when it is old or in doubt (``routing``). ``learn_capacity=False``
  turns this off (capacity then comes only from ``health()`` and the ejection probes).
* Every ``run_task`` call sends one ``Idempotency-Key`` of its own. A submit whose reply was
  lost is re-submitted with that key to the same executor, which answers the stored verdict (or
  409 ``task_in_progress`` while it still grades): the tests never run twice for one call while
  that executor lives, and a new call (same body or not) always grades afresh. If the executor
  cannot be connected to any more, the grading died with it and the task is placed again,
  elsewhere: no verdict is lost to a dead executor. A session's ``finish`` is retried the same
  way (``session.py``); nothing else is ever replayed after a lost reply.
* Every call carries a ``(connect, read)`` timeout; calls that run tests or commands read for
  their own wall clock plus a margin.
* Every failure leaves through ``_exchange``, the one boundary that translates requests, urllib3
  and pydantic errors into the ``TaskExecutorError`` tree.
"""

from __future__ import annotations

import hashlib
import itertools
import json as _json
import logging
import random
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar, overload
from urllib.parse import urlencode

import pydantic
import requests
from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError

from .config import ClientConfig, Timeout, resolve_config
from .errors import (
    ConnectionLost,
    ExecutorBusy,
    ExecutorRejected,
    ExecutorTimeout,
    ExecutorUnreachable,
    ProtocolError,
    ReplyLost,
    SpecError,
    TaskExecutorError,
    first_problem,
    parse_spec,
)
from .protocol import (
    IDEMPOTENCY_HEADER,
    ErrorResponse,
    HealthResponse,
    SessionStartResult,
    SessionStartSpec,
    TaskResult,
    TaskSpec,
    template_key,
)
from .routing import ExecutorStatus, Fleet, Kind, backoff_delay
from .session import RemoteSession
from .transport import ConnectFailed, WireAdapter

log = logging.getLogger(__name__)

M = TypeVar("M", bound=pydantic.BaseModel)
T = TypeVar("T")

USER_AGENT = "dockyard-sandbox-client/1"
_BUSY_STATUSES = frozenset({429, 503})
CONDITIONS_MISMATCH = "conditions_mismatch"


class _GradingDied(Exception):
    """The executor that accepted a task stopped answering connects: its grading is gone."""

    def __init__(self, lost: ReplyLost) -> None:
        super().__init__(str(lost))
        self.lost = lost


class SandboxClient:
    """A pooled connection to a fleet of task executors. Thread-safe; use one per process.

    ``urls``, ``token``, ``timeout``, ``config``, ``routing`` and ``affinity_k`` are resolved by
    ``sandbox_client.config.resolve_config``; ``sleep`` is how the client waits between busy
    retries (tests pass a recorder); ``learn_capacity``: ask an executor's ``/health`` before
    the first call placed on it (and again when what it said is old or in doubt).
    """

    def __init__(
        self,
        urls: str | Iterable[str] | None = None,
        token: str | None = None,
        timeout: Timeout | None = None,
        config: Any = None,
        *,
        task_timeout: float | None = None,
        routing: str | None = None,
        affinity_k: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        pool: Any = None,
        learn_capacity: bool = True,
    ) -> None:
        self.config: ClientConfig = resolve_config(
            urls, token, timeout, config, task_timeout=task_timeout, routing=routing,
            affinity_k=affinity_k,
        )
        self._sleep = sleep
        #: The image pool (``sandbox_client.pool.Pool``) specs with an ``image`` go through.
        self.pool = pool
        self._jitter = random.Random()
        self._fleet = Fleet(
            self.config.urls,
            routing=self.config.routing,
            affinity_k=self.config.affinity_k,
            probe=self._probe,
            probe_base_s=self.config.probe_base_s,
            probe_max_s=self.config.probe_max_s,
            learn=self._probe if learn_capacity else None,
        )
        self._http = requests.Session()
        # Proxy variables and .netrc are for humans; executors are called by pod IP directly.
        self._http.trust_env = False
        # Never replays a request on its own (that is our decision); see transport.
        adapter = WireAdapter(pool_maxsize=self.config.pool_maxsize)
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)
        self._adapter = adapter
        self._http.headers["User-Agent"] = USER_AGENT
        if self.config.token:
            self._http.headers["Authorization"] = f"Bearer {self.config.token}"

    @property
    def urls(self) -> tuple[str, ...]:
        """The executors this client deals work to."""
        return self.config.urls

    def __repr__(self) -> str:
        return f"SandboxClient(urls={list(self.urls)!r})"

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop probing ejected executors and drop pooled connections."""
        self._fleet.close()
        self._http.close()

    # -- public calls -------------------------------------------------------------------------

    def run_task(self, spec: TaskSpec | Mapping[str, Any]) -> TaskResult:
        """Grade one patch on the executor its template is placed on; raises
        ``TaskExecutorError`` on failure, and ``SpecError`` at once (nothing sent) for a spec that
        does not validate."""
        task = self.config.with_conditions(
            self.config.with_task_timeout(parse_spec(TaskSpec, spec)))
        body = task.model_dump(mode="json", exclude_none=True)
        read = self.config.run_read_timeout(task.timeout)
        key = template_key(task.repo, task.base_commit, task.setup, task.env)
        # One key per call: its own re-submits replay the verdict, a new call grades afresh.
        submission = uuid.uuid4().hex
        if task.image is not None:
            lease, result = self._pooled(
                task, key, "task", f"task {task.task_id}",
                lambda url: self._submit(url, task.task_id, body, read, submission,
                                         spill=False))
            log.info("task %s: %s in %.1fs on %s (image %s)", task.task_id, result.status,
                     result.duration_s, lease.url, task.image)
            return result
        url, result = self._place(
            "task", key, f"task {task.task_id}",
            lambda url: self._submit(url, task.task_id, body, read, submission),
        )
        log.info("task %s: %s in %.1fs on %s", task.task_id, result.status, result.duration_s, url)
        return result

    def start_session(self, spec: SessionStartSpec | Mapping[str, Any]) -> RemoteSession:
        """Open a shell session where its template is placed; later calls all go there."""
        start = self.config.with_conditions(parse_spec(SessionStartSpec, spec))
        body = start.model_dump(mode="json", exclude_none=True)
        read = self.config.run_read_timeout(None)
        key = template_key(start.repo, start.base_commit, start.setup, start.env)

        def begin(url: str, wait_busy: bool = False) -> SessionStartResult:
            # A fleet call spills to the next executor when this one is busy; a pod of the
            # pool is the only one for its image, so there it waits out 429s.
            return self._call(url, "POST", "/session/start", SessionStartResult, json=body,
                              read_timeout=read, wait_busy=wait_busy)

        if start.image is not None:
            lease, started = self._pooled(start, key, "session", "session start",
                                          lambda url: begin(url, wait_busy=True), keep=True)
            log.info("session %s: started on %s (image %s)", started.session_id, lease.url,
                     start.image)
            return RemoteSession(self, lease.url, started,
                                 command_timeout=start.command_timeout, on_end=lease.release)
        url, started = self._place("session", key, "session start", begin)
        log.info("session %s: started on %s", started.session_id, url)
        return self._held_session(url, started, start.command_timeout)

    def _held_session(self, url: str, started: SessionStartResult,
                      command_timeout: float | None) -> RemoteSession:
        """A session live on ``url``, counted in the room it holds there (a start's, or a
        fork's: a fork takes a session slot on its executor like a start)."""
        self._fleet.session_opened(url)
        # The room it holds is given back once: when it ends, or when it is dropped unended (the
        # executor reaps it when idle): a count that only grew would shut this client out. A
        # finalizer runs at most once, whichever comes first.
        ended: Callable[[], Any]
        session = RemoteSession(self, url, started, command_timeout=command_timeout,
                                on_end=lambda: ended())
        ended = weakref.finalize(session, self._fleet.session_ended, url)
        return session

    def _pooled(self, spec: Any, template: str, kind: str, what: str,
                attempt: Callable[[str], T], keep: bool = False) -> tuple[Any, T]:
        """Run ``attempt`` on a pod of ``spec.image`` from the pool (preferring one that built
        ``template``); a pod that does not answer is reported dead (the pool deletes it) and
        the call placed once more, on another pod. Returns the lease, released unless
        ``keep`` (the caller then releases it), and the answer."""
        image = spec.image
        if self.pool is None:
            raise SpecError(f"{what}: the spec names image {image!r}, but this client has "
                              "no pool (SandboxClient(pool=...))", field="image",
                              model=type(spec).__name__, problem="no pool for images")
        for attempt_no in range(2):
            lease = self.pool.acquire(image, spec, kind=kind, template=template)
            try:
                answer = attempt(lease.url)
            except (ExecutorUnreachable, _GradingDied, ReplyLost) as exc:
                # A lost reply is safe to place again only when the pod is gone, and what it
                # started with it (a pooled connection to a killed executor is reset, not refused).
                if isinstance(exc, ReplyLost) and self.pool.alive(lease):
                    lease.release()
                    raise
                lease.release(dead=True)
                error = exc.lost if isinstance(exc, _GradingDied) else exc
                if attempt_no == 1:
                    raise error from None
                log.warning("%s: pod %s of %s did not answer (%s); placing it again", what,
                            lease.pod, image, error)
                continue
            except BaseException:
                lease.release()
                raise
            if not keep:
                lease.release()
            return lease, answer
        raise AssertionError("unreachable")  # pragma: no cover

    def health(self, url: str) -> HealthResponse:
        """``GET /health`` of one executor (no auth needed, no retries); its load tells the
        client the executor's capacity."""
        answer = self._exchange(url, "GET", "/health", HealthResponse, self.config.read_timeout)
        self._fleet.answered(url, answer.load)
        return answer

    def check_token(self, url: str) -> None:
        """One authenticated call on ``url`` (``GET /metrics``, no retries): raises
        ``ExecutorRejected`` with status 401 when it refuses this client's token."""
        self._exchange(url, "GET", "/metrics", None, self.config.read_timeout)

    def fleet_status(self) -> dict[str, ExecutorStatus]:
        """Each executor as this client sees it: healthy or ejected, requests in flight, last
        error, ejections, failed connects, task capacity, seconds to its next probe."""
        return self._fleet.status()

    def next_url(self) -> str:
        """The executor a round-robin placement would start from next (advances the counter)."""
        return self.urls[self._fleet.next_turn()]

    def _probe(self, url: str) -> Mapping[str, float]:
        """The monitor's ``/health`` probe of an ejected executor (not counted as a call's)."""
        read = min(self.config.read_timeout, self.config.probe_read_timeout)
        return self._exchange(url, "GET", "/health", HealthResponse, read, account=False).load

    # -- retry policy -------------------------------------------------------------------------

    def _place(
        self, kind: Kind, key: str, what: str, attempt: Callable[[str], T]
    ) -> tuple[str, T]:
        """Run ``attempt`` on the executor the fleet places ``key`` on, spilling to the next in
        preference while executors are unreachable, busy or died holding the task."""
        ranked = self._fleet.rank(key)
        out: set[str] = set()  # unreachable, or died under this call: not tried again
        busy: set[str] = set()  # answered 429/503 in this round
        failures: list[TaskExecutorError] = []
        rejected: ExecutorBusy | None = None
        mismatched: ExecutorRejected | None = None
        lost: ReplyLost | None = None
        waited, rounds = 0.0, 0
        started = time.monotonic()
        while True:
            # Only a call's first round waits in the client for room; later rounds have
            # already waited out a Retry-After and go ask.
            wait_until = started + self.config.busy_budget_s if rounds == 0 else None
            url = self._fleet.reserve(kind, ranked, out | busy, wait_until)
            if url is None:
                if rejected is None or not busy:
                    if mismatched is not None:
                        raise mismatched
                    if lost is not None:
                        raise lost
                    raise ExecutorUnreachable(
                        f"no executor reachable (tried {len(failures)}): "
                        + "; ".join(str(f) for f in failures)
                    ) from (failures[-1] if failures else None)
                delay = self._backoff(rounds, rejected.retry_after)
                if rounds >= self.config.busy_retries or waited + delay > self.config.busy_budget_s:
                    raise rejected
                log.info("%s: every executor busy (%s); retrying in %.1fs", what, rejected.code,
                         delay)
                self._sleep(delay)
                waited += delay
                rounds += 1
                busy.clear()
                continue
            answer: ExecutorBusy | None = None
            try:
                return url, attempt(url)
            except ExecutorBusy as exc:
                answer = rejected = exc
                busy.add(url)
                log.info("%s: %s answered %s; trying the next executor", what, url, exc.code)
            except ExecutorRejected as exc:
                if exc.code != CONDITIONS_MISMATCH:
                    raise
                out.add(url)
                mismatched = exc
                log.info("%s: %s cannot give its conditions (%s); trying the next executor",
                         what, url, exc.message)
            except ExecutorUnreachable as exc:
                out.add(url)
                failures.append(exc)
                log.warning("%s: %s unreachable (%s); trying the next executor", what, url,
                            exc.message)
            except _GradingDied as died:
                out.add(url)
                lost = died.lost
                log.warning("%s: %s died holding it (%s); placing it again", what, url,
                            died.lost.message)
            finally:
                self._fleet.release(url, kind, answer is not None,
                                    answer.retry_after if answer is not None else None)

    def _submit(
        self, url: str, task_id: str, body: dict[str, Any], read: float, submission: str,
        spill: bool = True,
    ) -> TaskResult:
        """Submit, and after a lost reply re-submit with the same idempotency key to the same
        executor."""
        lost: ReplyLost | None = None
        for attempt in range(self.config.resubmits + 1):
            if lost is not None and not self._fleet.still_there(url):
                raise _GradingDied(lost)
            try:
                return self._call(
                    url,
                    "POST",
                    "/task/submit",
                    TaskResult,
                    json=body,
                    headers={IDEMPOTENCY_HEADER: submission},
                    read_timeout=read,
                    poll_in_progress=True,
                    # Not taken yet: the placement may try elsewhere. Once it may be grading
                    # here, a re-submit must wait for this executor.
                    wait_busy=lost is not None or not spill,
                )
            except ReplyLost as exc:
                lost = exc
                log.warning(
                    "task %s: reply lost from %s (%s); re-submit %d of %d with the same key",
                    task_id,
                    url,
                    exc.message,
                    attempt + 1,
                    self.config.resubmits,
                )
            except ExecutorUnreachable as exc:
                if lost is None:
                    raise
                # The executor that accepted the task is gone, and the grading with it (its
                # sandboxes die with it): grading it elsewhere cannot run it twice at once.
                raise _GradingDied(lost) from exc
        assert lost is not None
        raise lost

    def _call(
        self,
        url: str,
        method: str,
        path: str,
        model: type[M] | None,
        *,
        read_timeout: float,
        poll_in_progress: bool = False,
        wait_busy: bool = True,
        **send: Any,
    ) -> Any:
        """One call on one executor, waiting out 429/503 unless ``wait_busy`` is false (and 409
        task_in_progress if asked)."""
        waited = 0.0
        for attempt in itertools.count():
            try:
                return self._exchange(url, method, path, model, read_timeout, **send)
            except ExecutorRejected as exc:
                busy = isinstance(exc, ExecutorBusy)
                in_progress = poll_in_progress and exc.code == "task_in_progress"
                if not (busy and wait_busy or in_progress):
                    raise
                # A task still grading may rightly take its whole wall clock; "busy" may not.
                budget = self.config.busy_budget_s + (0.0 if busy else read_timeout)
                # Polling a running task keeps to its Retry-After instead of backing off ever
                # further: the stored verdict should be picked up soon after it exists.
                delay = self._backoff(attempt if busy else 0, exc.retry_after)
                if (busy and attempt >= self.config.busy_retries) or waited + delay > budget:
                    raise
                log.info("%s %s: %s; retrying in %.1fs", method, path, exc.code, delay)
                self._sleep(delay)
                waited += delay
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        # Jitter only upwards: Retry-After is a floor, and spreading the retries of a batch that
        # was turned away at once keeps it from coming back at once.
        return backoff_delay(attempt, self.config.backoff_base_s, self.config.backoff_max_s,
                             self._jitter, floor=retry_after or 0.0)

    # -- the boundary -------------------------------------------------------------------------

    @overload
    def _exchange(
        self, url: str, method: str, path: str, model: type[M], read_timeout: float, *,
        account: bool = True, **send: Any
    ) -> M: ...

    @overload
    def _exchange(
        self, url: str, method: str, path: str, model: None, read_timeout: float, *,
        account: bool = True, **send: Any
    ) -> requests.Response: ...

    def _exchange(
        self,
        url: str,
        method: str,
        path: str,
        model: type[M] | None,
        read_timeout: float,
        *,
        account: bool = True,
        **send: Any,
    ) -> M | requests.Response:
        """Send one request; return the decoded answer or raise from the ``TaskExecutorError``
        tree. The only place where foreign exceptions are translated, and where the fleet learns
        what each call met (``account=False``: the monitor's probes, which it books itself)."""
        what = f"{method} {path}"
        since = self._fleet.entered(url) if account else None
        try:
            response = self._send(method, url + path, read_timeout, **send)
        except requests.RequestException as exc:
            error = _transport_error(exc, what, url)
            if account and isinstance(error, ExecutorUnreachable):
                self._fleet.connect_failed(url, error.message)
            elif account and isinstance(error, ConnectionLost):
                self._fleet.connection_broke(url, error.message)
            elif account:
                self._fleet.failed(url, error.message)
            raise error from exc
        finally:
            if account:
                self._fleet.left(url)
        if account:
            self._fleet.answered(url, since=since)
        if response.status_code >= 400:
            raise _rejection(response, url)
        if model is None:
            _check_digest(response, what, url)
            return response
        try:
            return model.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            where, problem = first_problem(exc)
            raise ProtocolError(
                f"{what}: answer is not a valid {model.__name__} ({where}: {problem})", url=url
            ) from exc

    def _send(
        self, method: str, url: str, read_timeout: float, *,
        headers: dict[str, str] | None = None, **send: Any,
    ) -> requests.Response:
        """``requests.Session.request`` without what a call to an executor never uses (cookies,
        hooks, proxies and .netrc, redirects): about a third of a short call's time in the
        client. The adapter (``transport.WireAdapter``) sends it and raises as requests'
        own would."""
        return self._adapter.send(
            _prepare(method, url, {**self._http.headers, **(headers or {})}, **send),
            timeout=(self.config.connect_timeout, read_timeout),
        )


def _prepare(
    method: str, url: str, headers: dict[str, str | bytes], *,
    json: Any = None, data: bytes | None = None, params: Mapping[str, str] | None = None,
) -> requests.PreparedRequest:
    """The request as ``requests.Request(...).prepare()`` makes it, for the bodies this client
    sends (JSON, bytes or none), without re-parsing and re-validating a URL this client built
    itself (a tenth of the time)."""
    prepared = requests.PreparedRequest()
    prepared.method = method
    prepared.url = f"{url}?{urlencode(params)}" if params else url
    body: bytes | None = data or None  # as requests: an empty body is none
    if json is not None:
        body = _json.dumps(json, allow_nan=False).encode()
        headers = {"Content-Type": "application/json", **headers}
    if body is not None or method not in ("GET", "HEAD"):
        headers = {**headers, "Content-Length": str(len(body or b""))}
    prepared.headers = requests.structures.CaseInsensitiveDict(headers)
    prepared.body = body
    prepared.hooks = {"response": []}
    return prepared


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """Every exception reachable from ``exc`` through args, ``reason``, cause and context."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [*current.args, getattr(current, "reason", None)]
        linked += [current.__cause__, current.__context__]
        stack.extend(item for item in linked if isinstance(item, BaseException))


def _transport_error(exc: requests.RequestException, what: str, url: str) -> TaskExecutorError:
    """Classify by cause: only a failed connect proves the request never reached a server."""
    causes = list(_causes(exc))
    root = causes[-1]  # exc itself when nothing is linked to it (causes[0] is always exc)
    # NewConnectionError (refused, unresolvable) subclasses ConnectTimeoutError in urllib3.
    if isinstance(exc, (requests.ConnectTimeout, ConnectFailed)) or any(
        isinstance(c, ConnectTimeoutError) for c in causes
    ):
        return ExecutorUnreachable(f"{what}: could not connect ({root})", url=url)
    if isinstance(
        exc,
        (
            requests.exceptions.InvalidURL,
            requests.exceptions.InvalidSchema,
            requests.exceptions.MissingSchema,
        ),
    ):
        return ExecutorUnreachable(f"{what}: invalid URL ({exc})", url=url)
    if isinstance(exc, requests.ReadTimeout) or any(
        isinstance(c, ReadTimeoutError) for c in causes
    ):
        return ExecutorTimeout(f"{what}: no answer in time ({root})", url=url)
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return ProtocolError(f"{what}: undecodable body ({exc})", url=url)
    return ConnectionLost(f"{what}: connection lost ({root})", url=url)


def _rejection(response: requests.Response, url: str) -> ExecutorRejected:
    """An error answer as ``ExecutorRejected``; tolerant of bodies that are not protocol JSON
    (a proxy's HTML 502 still says something useful)."""
    status = response.status_code
    try:
        detail = ErrorResponse.model_validate_json(response.content).error
        code, message = detail.code, detail.message
    except pydantic.ValidationError:
        code = f"http_{status}"
        message = response.text.strip()[:300] or (response.reason or "")
    cls = ExecutorBusy if status in _BUSY_STATUSES else ExecutorRejected
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    return cls(message, code=code, status=status, retry_after=retry_after, url=url)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds, from delta-seconds or an HTTP date; None if absent or bad.
    (The provisioner reads the Kubernetes API's header with it too.)"""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _check_digest(response: requests.Response, what: str, url: str) -> None:
    """Raw bodies that carry ``X-File-Size`` / ``X-File-SHA256`` must match them exactly."""
    size = response.headers.get("X-File-Size")
    digest = response.headers.get("X-File-SHA256")
    body = response.content
    if size is not None and size.strip() != str(len(body)):
        raise ProtocolError(f"{what}: got {len(body)} bytes, header says {size}", url=url)
    if digest is not None and digest.strip().lower() != hashlib.sha256(body).hexdigest():
        raise ProtocolError(f"{what}: body does not match its X-File-SHA256", url=url)
