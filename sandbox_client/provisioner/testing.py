"""A stand-in Kubernetes API server for the pod routes the provisioner uses, with injected faults.

No cluster is needed to test the failure paths that leak pods on a real one (Sandman table A21):
the stand-in stores pods in memory and answers ``create``, ``read``, ``list`` (label selector)
and ``delete`` as the API server does, and a test queues :class:`Fault` objects that make the
next matching request misbehave in one precise window:

- ``delay`` / ``hold``: wait (admission taking time) before the request takes effect;
- ``store``: whether the request takes effect (the pod is stored / deleted) before the answer;
- ``after_hold``: wait after it took effect, before answering;
- ``status`` (+ ``retry_after``): answer an error instead of success, e.g. 500 after storing;
- ``drop``: close the connection without answering (a lost reply), after or before storing.

Pods become Running and Ready, with a pod IP in 127.0.0.0/8, ``ready_after`` seconds after they
are created, except the next ``never_ready_next`` ones; deletes can be made slow
(``delete_after``). Every request is recorded with a time from an injectable clock (e.g.
:class:`FakeClock`), and the high-water mark of live job pods is kept, so tests assert pacing
and the live-pod cap on the server's own records.

Per image (the executor container's, i.e. the task image of a carrier pod), :class:`ImagePlan`
makes pods stay ``ContainerCreating`` (pulling) for ``pull_s`` more seconds, stay unschedulable
with a scheduler message, or fail their pull with ``ErrImagePull``. With a ``pod_runner`` (see
:mod:`.podrunner`) a pod whose start is over runs as a real executor process at 127.0.0.1, its
port in the ``dockyard.io/port`` annotation; a delete stops that process before the pod goes.

It listens on 127.0.0.1 only. ``python -m sandbox_client.provisioner.testing`` runs one by hand.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from .manifests import JOB_LABEL
from .podrunner import PORT_ANNOTATION

Verb = str  # "create" | "read" | "list" | "delete"
REASONS = {404: "NotFound", 409: "AlreadyExists", 429: "TooManyRequests", 403: "Forbidden",
           500: "InternalError", 503: "ServiceUnavailable"}


class FakeClock:
    """A manual clock for tests: ``sleep`` advances time instantly instead of waiting."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` (negative values are ignored)."""
        with self._lock:
            self._now += max(0.0, seconds)


@dataclass
class Fault:
    """What the next request of ``verb`` (for pod ``name``, if given) does wrong; ``times`` uses."""

    verb: Verb
    status: int | None = None
    store: bool = True
    drop: bool = False
    delay: float = 0.0
    hold: threading.Event | None = None
    after_hold: threading.Event | None = None
    retry_after: float | None = None
    name: str | None = None
    times: int = 1


@dataclass
class Record:
    """One request as the stand-in saw it on arrival."""

    at: float
    verb: Verb
    name: str | None
    outcome: str = ""


@dataclass(frozen=True)
class ImagePlan:
    """How pods of one image behave in the stand-in."""

    pull_s: float = 0.0
    """Extra seconds in ``ContainerCreating`` (pulling the image) before the pod starts."""
    unschedulable: str = ""
    """Non-empty: the pod stays Pending with ``PodScheduled=False``, this as the message."""
    pull_error: str = ""
    """Non-empty: the pull fails with ``ErrImagePull`` and this message (e.g. "... not found")."""


class PodRunner(Protocol):
    """Runs a pod's executor as a local process (see :class:`.podrunner.ExecutorPodRunner`)."""

    def start(self, name: str, body: dict[str, Any]) -> int: ...
    def stop(self, name: str) -> None: ...
    def alive(self, name: str) -> bool: ...


@dataclass
class _Pod:
    body: dict[str, Any]
    created: float
    ready: bool = True
    deleting_since: float | None = None
    run: str = ""
    """With a runner: "" (not started), starting, running, failed, stopping, stopped."""
    port: int | None = None
    failure: str = ""


@dataclass
class StandInAPI:
    """In-memory pod store plus fault queue; served over HTTP by :class:`StandInServer`."""

    ready_after: float = 0.0
    delete_after: float = 0.0
    clock: Callable[[], float] = time.monotonic
    pods: dict[tuple[str, str], _Pod] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    high_water: int = 0
    high_water_by_job: dict[str, int] = field(default_factory=dict)
    never_ready_next: int = 0
    images: dict[str, ImagePlan] = field(default_factory=dict)
    pod_runner: PodRunner | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._faults: list[Fault] = []
        self._holds: list[threading.Event] = []
        self._ips = itertools.count(2)

    # -- test controls ------------------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each applies to the next matching request(s)."""
        with self._lock:
            self._faults.extend(faults)
            for fault in faults:
                self._holds.extend(e for e in (fault.hold, fault.after_hold) if e is not None)

    def pending_faults(self) -> int:
        with self._lock:
            return sum(fault.times for fault in self._faults)

    def add_pod(self, namespace: str, body: dict[str, Any]) -> None:
        """Store a pod directly, as another tenant would have (not counted as a job pod)."""
        with self._lock:
            self._store(namespace, body, ready=True)

    def wait_for(self, verb: Verb, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``count`` requests of ``verb`` have arrived (on any clock)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(r.verb == verb for r in self.records) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def count(self, verb: Verb) -> int:
        """How many requests of ``verb`` have arrived so far."""
        with self._lock:
            return sum(r.verb == verb for r in self.records)

    def times(self, verb: Verb) -> list[float]:
        with self._lock:
            return [r.at for r in self.records if r.verb == verb]

    def live(self, namespace: str | None = None, label: str = JOB_LABEL) -> list[dict[str, Any]]:
        """Pods still stored (terminating ones included) that carry ``label``."""
        with self._lock:
            self._purge()
            return [p.body for (ns, _), p in self.pods.items()
                    if (namespace is None or ns == namespace)
                    and label in p.body["metadata"].get("labels", {})]

    # -- request handling ---------------------------------------------------------------------

    def _take_fault(self, verb: Verb, name: str | None) -> Fault | None:
        for fault in self._faults:
            if fault.verb == verb and (fault.name is None or fault.name == name):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def arrive(self, verb: Verb, name: str | None) -> tuple[Record, Fault | None]:
        with self._lock:
            record = Record(self.clock(), verb, name)
            self.records.append(record)
            fault = self._take_fault(verb, name)
            self._lock.notify_all()
            return record, fault

    def _store(self, namespace: str, body: dict[str, Any], ready: bool) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["namespace"] = namespace
        meta["resourceVersion"] = str(len(self.records) + 1)
        meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "Pod")
        body["status"] = {"phase": "Pending"}
        self.pods[(namespace, meta["name"])] = _Pod(body, time.monotonic(), ready)
        jobs = [p.body["metadata"].get("labels", {}).get(JOB_LABEL) for p in self.pods.values()]
        self.high_water = max(self.high_water, sum(job is not None for job in jobs))
        job = meta.get("labels", {}).get(JOB_LABEL)
        if job is not None:
            self.high_water_by_job[job] = max(self.high_water_by_job.get(job, 0), jobs.count(job))
        return body

    def create(self, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("metadata", {}).get("name", "")
        with self._lock:
            self._purge()
            if (namespace, name) in self.pods:
                return 409, _status(409, f'pods "{name}" already exists')
            ready = self.never_ready_next <= 0
            if not ready:
                self.never_ready_next -= 1
            return 201, self._view(self._store(namespace, body, ready))

    def read(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._purge()
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, f'pods "{name}" not found')
            return 200, self._view(pod.body)

    def list(self, namespace: str, selector: str) -> tuple[int, dict[str, Any]]:
        wanted = [term.split("=", 1) for term in selector.split(",") if term]
        with self._lock:
            self._purge()
            items = [self._view(p.body) for (ns, _), p in self.pods.items() if ns == namespace
                     and _matches(p.body["metadata"].get("labels", {}), wanted)]
        return 200, {"apiVersion": "v1", "kind": "PodList",
                     "metadata": {"resourceVersion": "1"}, "items": items}

    def delete(self, namespace: str, name: str,
               uid: str | None = None) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._purge()
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, f'pods "{name}" not found')
            if uid is not None and pod.body["metadata"]["uid"] != uid:
                # As the API server does: a uid precondition protects a same-named stranger.
                return 409, _status(409, f"Precondition failed: UID in precondition: {uid}")
            if pod.deleting_since is None:
                pod.deleting_since = time.monotonic()
                pod.body["metadata"]["deletionTimestamp"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                if pod.run in ("running", "failed"):
                    self._stop_runner(pod)
                elif pod.run == "":
                    pod.run = "stopped"  # never started: nothing to stop
            self._purge()
            return 200, self._view(pod.body)

    def _purge(self) -> None:
        now = time.monotonic()
        # A pod whose executor process is still stopping stays, terminating, as on a kubelet.
        gone = [key for key, pod in self.pods.items()
                if pod.deleting_since is not None and now - pod.deleting_since >= self.delete_after
                and pod.run in ("", "stopped")]
        for key in gone:
            del self.pods[key]

    def _view(self, body: dict[str, Any]) -> dict[str, Any]:
        """The pod with its status as of now: Running and Ready once ``ready_after`` has passed."""
        key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
        pod = self.pods.get(key)
        if pod is not None and body["status"].get("phase") == "Pending":
            self._advance(pod)
        if pod is not None and self.pod_runner is not None and pod.run == "running" \
                and not self.pod_runner.alive(body["metadata"]["name"]):
            pod.run, pod.failure = "failed", "executor exited"
            body["status"] = {"phase": "Failed", "message": pod.failure,
                              "conditions": [{"type": "Ready", "status": "False"}]}
        return json.loads(json.dumps(body))

    def _advance(self, pod: _Pod) -> None:
        """Move a Pending pod on: unschedulable, pulling, failed pull, then (runner) Ready."""
        body = pod.body
        image = (body.get("spec", {}).get("containers") or [{}])[0].get("image", "")
        plan = self.images.get(image, ImagePlan())
        if plan.unschedulable:
            body["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": plan.unschedulable}]}
            return
        scheduled = [{"type": "PodScheduled", "status": "True"}]
        if plan.pull_error:
            body["status"] = {"phase": "Pending", "conditions": scheduled, "containerStatuses": [
                {"name": "executor", "ready": False, "state": {"waiting": {
                    "reason": "ErrImagePull", "message": plan.pull_error}}}]}
            return
        started = time.monotonic() - pod.created >= self.ready_after + plan.pull_s
        if not pod.ready or not started or pod.deleting_since is not None:
            if plan.pull_s or self.pod_runner is not None:
                body["status"] = {"phase": "Pending", "conditions": scheduled,
                                  "containerStatuses": [{"name": "executor", "ready": False,
                                                         "state": {"waiting": {
                                                             "reason": "ContainerCreating"}}}]}
            return
        if self.pod_runner is None:
            n = next(self._ips)
            body["status"] = {
                "phase": "Running",
                "podIP": f"127.0.{(n // 250) % 250}.{n % 250 + 2}",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            return
        if pod.run == "":
            pod.run = "starting"
            threading.Thread(target=self._start_runner, args=(pod,), daemon=True).start()
        elif pod.run == "running":
            body["status"] = {"phase": "Running", "podIP": "127.0.0.1",
                              "conditions": [{"type": "Ready", "status": "True"}]}
        elif pod.run == "failed":
            body["status"] = {"phase": "Failed", "message": pod.failure}

    def _start_runner(self, pod: _Pod) -> None:
        assert self.pod_runner is not None
        name = pod.body["metadata"]["name"]
        try:
            port: int | None = self.pod_runner.start(name, pod.body)
            failure = ""
        except Exception as exc:  # the pod fails, as a crashing container does
            port, failure = None, str(exc)
        with self._lock:
            pod.port, pod.failure = port, failure
            pod.run = "running" if port is not None else "failed"
            if port is not None:
                pod.body["metadata"].setdefault("annotations", {})[PORT_ANNOTATION] = str(port)
            if pod.deleting_since is not None:
                self._stop_runner(pod)  # deleted while starting
            self._lock.notify_all()

    def _stop_runner(self, pod: _Pod) -> None:
        """Stop the pod's process on a thread (the caller holds the lock); the pod stays
        terminating until it is stopped."""
        pod.run = "stopping"

        def stop() -> None:
            assert self.pod_runner is not None
            self.pod_runner.stop(pod.body["metadata"]["name"])
            with self._lock:
                pod.run = "stopped"
                self._lock.notify_all()

        threading.Thread(target=stop, daemon=True).start()


def _matches(labels: dict[str, str], wanted: list[list[str]]) -> bool:
    for term in wanted:
        if len(term) == 1:
            if term[0] not in labels:
                return False
        elif labels.get(term[0]) != term[1]:
            return False
    return True


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": REASONS.get(code, "Unknown"), "code": code}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real API server and urllib3 use
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: tests read the stand-in's records, not its access log."""

    def do_POST(self) -> None:
        self._route("POST")

    def do_GET(self) -> None:
        self._route("GET")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        segments = parts.path.strip("/").split("/")
        # api/v1/namespaces/<ns>/pods[/<name>]
        if len(segments) < 5 or segments[:3] != ["api", "v1", "namespaces"] \
                or segments[4] != "pods" or len(segments) > 6:
            self._answer(404, _status(404, f"no route {parts.path}"))
            return
        namespace = segments[3]
        name = segments[5] if len(segments) == 6 else None
        api = self.server.api
        if method == "POST" and name is None:
            body = json.loads(raw or b"{}")
            verb, name = "create", body.get("metadata", {}).get("name")
            act: Callable[[], tuple[int, dict[str, Any]]] = partial(api.create, namespace, body)
        elif method == "GET" and name is None:
            selector = parse_qs(parts.query).get("labelSelector", [""])[0]
            verb, act = "list", partial(api.list, namespace, selector)
        elif method == "GET":
            verb, act = "read", partial(api.read, namespace, name)
        elif method == "DELETE" and name is not None:
            options = json.loads(raw or b"{}")
            uid = (options.get("preconditions") or {}).get("uid")
            verb, act = "delete", partial(api.delete, namespace, name, uid)
        else:
            self._answer(405, _status(405, "method not allowed"))
            return
        record, fault = api.arrive(verb, name)
        self._perform(record, fault, act)

    def _perform(self, record: Record, fault: Fault | None,
                 act: Callable[[], tuple[int, dict[str, Any]]]) -> None:
        if fault is not None:
            if fault.hold is not None:
                fault.hold.wait(30)
            if fault.delay:
                time.sleep(fault.delay)
        status, payload = act() if fault is None or fault.store else (0, {})
        if fault is not None:
            if fault.after_hold is not None:
                fault.after_hold.wait(30)
        if fault is not None and fault.drop:
            record.outcome = f"dropped after {status or 'nothing'}"
            self.close_connection = True  # no answer at all: the client sees a lost reply
            return
        if fault is not None and fault.status is not None:
            status, payload = fault.status, _status(fault.status, "injected fault")
        record.outcome = str(status)
        self._answer(status, payload, fault.retry_after if fault else None)

    def _answer(self, status: int, payload: dict[str, Any],
                retry_after: float | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", f"{retry_after:g}")
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: StandInAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out and hung up is a tested case, not a server error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class StandInServer:
    """Serves a :class:`StandInAPI` on 127.0.0.1 (port 0: any free port) in a background thread."""

    def __init__(self, api: StandInAPI | None = None, port: int = 0) -> None:
        self.api = api or StandInAPI()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.api = self.api
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StandInServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every held request, then stop serving."""
        with self.api._lock:
            for hold in self.api._holds:
                hold.set()
        self._server.shutdown()
        self._server.server_close()


def main() -> None:
    """Run a stand-in by hand: ``python -m sandbox_client.provisioner.testing``."""
    with StandInServer(StandInAPI(ready_after=1.0)) as server:
        print(server.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
