"""The spawner that forks sandboxes into launch namespaces: it forks, and a launch never hangs on
it once its thread has gone (every launch of the executor goes through that one thread)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from task_executor.sandbox import namespaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setns needs CAP_SYS_ADMIN: root")


@pytest.fixture
def own_namespace() -> Iterator[int]:
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_launch_fails_instead_of_waiting_on_a_spawner_thread_that_has_stopped(
    own_namespace: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(namespaces, "_LIVENESS_CHECK_S", 0.05)
    spawner = namespaces._Spawner()
    process = spawner.popen(own_namespace, ["true"], {})
    assert process.wait() == 0

    spawner._requests.put(None)  # type: ignore[arg-type]  # unpacking it ends the thread
    spawner._thread.join()
    with pytest.raises(RuntimeError, match="spawner thread has stopped"):
        spawner.popen(own_namespace, ["true"], {})


def test_a_refused_fork_reaches_the_caller_and_the_spawner_goes_on(own_namespace: int) -> None:
    spawner = namespaces._Spawner()
    with pytest.raises(FileNotFoundError):
        spawner.popen(own_namespace, ["/nonexistent/dockyard-no-such-program"], {})
    assert spawner.popen(own_namespace, ["true"], {}).wait() == 0
