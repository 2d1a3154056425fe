"""DockyardRuntime / DockyardDeployment against a real executor, beyond SWE-ReX's own suite
(tests/frameworks/swerex): the deployment's lifecycle, execute's subprocess semantics, the
interrupt of a running command with the shell kept, modes kept by upload."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("swerex")

from swerex.exceptions import (  # noqa: E402
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
)
from swerex.runtime.abstract import (  # noqa: E402
    BashAction,
    BashInterruptAction,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.errors import ExecutorRejected  # noqa: E402
from sandbox_client.integrations.swerex import (  # noqa: E402
    DockyardDeployment,
    DockyardRuntime,
    command_line,
    shell_name,
)
from task_executor.demo import DemoTask  # noqa: E402


def test_shell_names_keep_valid_names_and_digest_the_rest() -> None:
    assert shell_name("default") == "rex.default"
    odd = shell_name("my session/1")
    assert odd.startswith("rex.") and len(odd) <= 64 and odd != shell_name("my session/2")


def test_command_line_has_subprocess_meaning() -> None:
    assert command_line(["echo", "a b", "$HOME"], shell=False) == "echo 'a b' '$HOME'"
    assert command_line("echo $HOME | wc", shell=True) == "echo $HOME | wc"
    assert command_line("my prog", shell=False) == "'my prog'"


T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@pytest.fixture
def deployment(demo_task: DemoTask, client: SandboxClient) -> Iterator[DockyardDeployment]:
    made = DockyardDeployment(client=client, task={"repo": demo_task.repo,
                                                   "base_commit": demo_task.base_commit})
    run(made.start())
    yield made
    run(made.stop())


def test_deployment_lifecycle_starts_and_closes_its_session(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    deployment = DockyardDeployment(client=client, task={"repo": demo_task.repo,
                                                         "base_commit": demo_task.base_commit})
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime
    run(deployment.start())
    session = deployment.runtime.session
    assert run(deployment.is_alive()).is_alive
    run(deployment.stop())
    with pytest.raises(ExecutorRejected) as gone:
        session.state()
    assert gone.value.status == 404


def test_execute_is_a_subprocess_call(deployment: DockyardDeployment) -> None:
    runtime: DockyardRuntime = deployment.runtime
    out = run(runtime.execute(Command(command=["printf", "%s|", "a b", "$X"], timeout=30)))
    assert (out.stdout, out.exit_code) == ("a b|$X|", 0)
    here = run(runtime.execute(Command(command="cd /; export X=1; pwd", shell=True)))
    assert here.stdout == "/\n"
    # Nothing of that call persists: the next one starts in the working tree, X unset.
    after = run(runtime.execute(Command(command='pwd; echo "[$X]"', shell=True)))
    assert after.stdout == f"{runtime.session.workdir}\n[]\n"
    scoped = run(runtime.execute(Command(command='pwd; echo "$X"', shell=True, cwd="/tmp",
                                         env={"X": "y z"})))
    assert scoped.stdout == "/tmp\ny z\n"
    with pytest.raises(NonZeroExitCodeError):
        run(runtime.execute(Command(command="exit 3", shell=True, check=True)))
    with pytest.raises(CommandTimeoutError):
        run(runtime.execute(Command(command=["sleep", "30"], timeout=0.5)))


def test_files_round_trip_and_a_missing_one_is_file_not_found(
    deployment: DockyardDeployment,
) -> None:
    runtime = deployment.runtime
    run(runtime.write_file(WriteFileRequest(path="notes/new.txt", content="été\n")))
    assert run(runtime.read_file(ReadFileRequest(path="notes/new.txt"))).content == "été\n"
    with pytest.raises(FileNotFoundError):
        run(runtime.read_file(ReadFileRequest(path="no/such/file")))


def test_sessions_are_named_shells_with_their_own_state(deployment: DockyardDeployment) -> None:
    runtime = deployment.runtime
    with pytest.raises(SessionDoesNotExistError):
        run(runtime.run_in_session(BashAction(command="true")))
    run(runtime.create_session(CreateBashSessionRequest(session="a")))
    run(runtime.create_session(CreateBashSessionRequest(session="b")))
    run(runtime.run_in_session(BashAction(command="cd /tmp; v=1", session="a")))
    a = run(runtime.run_in_session(BashAction(command='pwd; echo "[$v]"', session="a")))
    b = run(runtime.run_in_session(BashAction(command='pwd; echo "[$v]"', session="b")))
    assert a.output == "/tmp\n[1]\n"
    assert b.output == f"{runtime.session.workdir}\n[]\n"


def test_interrupt_stops_the_running_command_and_keeps_the_shell(
    deployment: DockyardDeployment,
) -> None:
    runtime = deployment.runtime

    async def scenario() -> tuple[int | None, str]:
        await runtime.create_session(CreateBashSessionRequest())
        await runtime.run_in_session(BashAction(command="kept=yes"))
        running = asyncio.ensure_future(runtime.run_in_session(
            BashAction(command="sleep 60", timeout=120, check="silent")))
        while not running.done():  # until the interrupt lands on the running sleep
            await runtime.run_in_session(BashInterruptAction())
            await asyncio.sleep(0.2)
        stopped = await running
        after = await runtime.run_in_session(BashAction(command='echo "$kept"'))
        return stopped.exit_code, after.output

    exit_code, output = run(scenario())
    assert exit_code != 0
    assert output == "yes\n"


def test_upload_keeps_file_modes(deployment: DockyardDeployment, tmp_path: Path) -> None:
    tool = tmp_path / "tools" / "bin" / "hello"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho hello from the tool\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    runtime = deployment.runtime
    # SWE-agent puts its tools under $HOME/tools (/root/tools when the sandbox runs as root).
    home = run(runtime.execute(Command(command='printf %s "$HOME"', shell=True))).stdout
    run(runtime.upload(UploadRequest(source_path=str(tmp_path / "tools"),
                                     target_path=f"{home}/tools")))
    out = run(runtime.execute(Command(command=[f"{home}/tools/bin/hello"])))
    assert out.stdout == "hello from the tool\n"
