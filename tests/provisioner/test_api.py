"""The client is configured for failure paths: no silent urllib3 retries, (connect, read) timeouts.

Against the stand-in, each lost or throttled reply must reach the provisioner as exactly one
request and one error of the right class; a retry hidden in urllib3 would turn a lost delete
reply into a 404 from its own second attempt, and hide requests from pacing.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner import PodAPI, ReplyLost, RequestNotSent
from sandbox_client.provisioner.api import APIConfig, load_configuration
from sandbox_client.provisioner.errors import APIServerError, APITooManyRequests
from sandbox_client.provisioner.manifests import PodSettings, pod_manifest
from sandbox_client.provisioner.testing import Fault

from .conftest import NAMESPACE, Harness


def test_configuration_turns_transparent_retries_off() -> None:
    configuration = load_configuration(APIConfig(host="http://127.0.0.1:1"))
    assert configuration.retries is False
    assert getattr(configuration, "client_go_retries", False) is False


@pytest.mark.parametrize(("verb", "fault", "error"), [
    ("delete", Fault("delete", drop=True), ReplyLost),
    ("read", Fault("read", drop=True), ReplyLost),
    ("read", Fault("read", status=503, store=False, retry_after=0.01), APIServerError),
    ("delete", Fault("delete", status=429, store=False, retry_after=0.01), APITooManyRequests),
])
def test_one_request_one_error(harness: Harness, verb: str, fault: Fault,
                               error: type[Exception]) -> None:
    harness.api.create(pod_manifest(PodSettings(), "p-1", "j", "i", "n"))
    before = harness.standin.count(verb)
    harness.standin.inject(fault)
    with pytest.raises(error):
        if verb == "read":
            harness.api.read("p-1")
        else:
            harness.api.delete("p-1")
    assert harness.standin.count(verb) == before + 1


def test_read_timeout_is_honoured(harness: Harness) -> None:
    # The stand-in holds its answer until the call has given up: only our read timeout can end
    # the call (no wall-clock bound to miss; a call that ignored it would hang, and the join's
    # guard turns that into a failure).
    hold = threading.Event()
    outcome: list[BaseException] = []

    def call() -> None:
        with PodAPI(APIConfig(host=harness.server.url, read_timeout_s=0.1), NAMESPACE) as api:
            try:
                api.read("anything")
            except BaseException as exc:  # judged below, on the test's thread
                outcome.append(exc)

    harness.standin.inject(Fault("read", hold=hold))
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(60)
    hold.set()
    assert not caller.is_alive(), "the read timeout was not honoured"
    assert len(outcome) == 1 and isinstance(outcome[0], ReplyLost)


def test_refused_connection_means_not_sent() -> None:
    with PodAPI(APIConfig(host="http://127.0.0.1:1", connect_timeout_s=0.5), NAMESPACE) as api:
        with pytest.raises(RequestNotSent):
            api.list("a=b")
