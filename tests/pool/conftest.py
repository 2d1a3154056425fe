"""Fixtures of the pool's Kubernetes tests: a stand-in API whose pods run as real executors.

``harness`` serves a :class:`StandInAPI` with the ``runner`` in force where it is asked for, so
a module may override ``runner`` (e.g. to give each pod its image's root) and keep the rest.
Stdlib only, like the provisioner's conftest: modules needing ``kubernetes`` skip themselves.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_client.provisioner.podrunner import ExecutorPodRunner
from sandbox_client.provisioner.testing import StandInAPI, StandInServer
from tests.provisioner.conftest import Harness


@pytest.fixture()
def runner() -> Iterator[ExecutorPodRunner]:
    pod_runner = ExecutorPodRunner()
    yield pod_runner
    pod_runner.stop_all()


@pytest.fixture()
def harness(runner: ExecutorPodRunner) -> Iterator[Harness]:
    with StandInServer(StandInAPI(pod_runner=runner)) as server:
        h = Harness(server)
        try:
            yield h
        finally:
            for prov in h.provisioners:
                prov.drain(timeout=30.0)
            h.api.close()
