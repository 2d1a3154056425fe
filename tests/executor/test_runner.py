"""The persistent shell against Sandman's tables A22 and A25-A27, with real bash and processes.

Children are detected the way Sandman did: each writes its own pid to a file once running, and
``/proc`` says whether that pid is still alive. Framing faults are injected by feeding crafted
chunks to the frame parser, and, end to end, by an agent-defined ``builtin`` function that makes
the real shell write a bad frame.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.sessions.framing import (
    Frame,
    FrameParser,
    IncompleteFrame,
    InvalidFrame,
    latest_state,
)
from task_executor.sessions.runner import SessionClosed, ShellSession, ShellStartError
from tests.processes import alive

NONCE = "0123456789abcdef0123456789abcdef"
# A child that records its pid once running, then sleeps; {f} is the pid file.
CHILD = "sh -c 'echo $$ > {f}; exec sleep 1000'"
# The same, ignoring SIGTERM (the disposition survives exec).
STUBBORN = "bash -c 'trap \"\" TERM; echo $$ > {f}; exec sleep 1000'"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LC_ALL": "C.UTF-8"}


@pytest.fixture
def shell(tmp_path: Path, env: dict[str, str]) -> Iterator[ShellSession]:
    session = ShellSession(str(tmp_path), env, default_timeout=30)
    yield session
    session.close()




def pids(*files: Path, within: float = 5.0) -> list[int]:
    """The pids the children wrote, waiting for each file to be filled."""
    deadline = time.monotonic() + within
    found = []
    for f in files:
        while not (f.exists() and f.read_text().strip()):
            assert time.monotonic() < deadline, f"child never wrote {f}"
            time.sleep(0.01)
        found.append(int(f.read_text()))
    return found


def living(pid_list: list[int], settle: float = 0.0) -> list[int]:
    time.sleep(settle)
    return [p for p in pid_list if alive(p)]


def wait_files(*files: Path) -> str:
    """Shell snippet: wait until each pid file is filled (so a kill comes after the start)."""
    return "; ".join(f"until [ -s {f} ]; do sleep 0.01; done" for f in files)


# -- persistence and the basics -------------------------------------------------------------


def test_state_persists_between_commands(shell: ShellSession, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert shell.run("cd sub; X=5; export Y=7; f() { echo fn:$1; }; declare -a A=(1 '2 3')")
    result = shell.run("pwd; echo \"$X $Y ${A[1]}\"; f a; bash -c 'echo child:$Y'")
    assert result.exit_code == 0
    assert result.output == f"{tmp_path}/sub\n5 7 2 3\nfn:a\nchild:7\n"
    assert shell.cwd() == str(tmp_path / "sub")
    assert shell.commands_run == 2


def test_exit_status_and_previous_status(shell: ShellSession) -> None:
    assert shell.run("false").exit_code == 1
    assert shell.run("echo $?").output == "1\n"
    assert shell.run("(exit 42)").exit_code == 42


def test_stdin_is_empty_and_output_merges_stderr(shell: ShellSession) -> None:
    result = shell.run("cat; read -r line; echo out; echo err >&2")
    assert result.exit_code == 0
    assert result.output == "out\nerr\n"


def test_binary_output_is_decoded_with_replacement(shell: ShellSession) -> None:
    result = shell.run(r"printf 'a\xff\xfeb\n'")
    assert result.output == "a\ufffd\ufffdb\n"
    assert result.output_bytes == 5


def test_output_is_capped_head_and_tail(tmp_path: Path, env: dict[str, str]) -> None:
    with ShellSession(str(tmp_path), env, output_cap=1000) as session:
        result = session.run("seq 1 100000")
    assert result.truncated
    assert result.output_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    assert "bytes omitted" in result.output


def test_nul_byte_is_refused(shell: ShellSession) -> None:
    result = shell.run("echo a\0b")
    assert result.exit_code == 2
    assert "NUL" in result.output


# -- A22: no child survives ------------------------------------------------------------------


def test_a22_timeout_plain_background_children(shell: ShellSession, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    result = shell.run(
        f"{CHILD.format(f=a)} & {CHILD.format(f=b)} & {wait_files(a, b)}; echo started; sleep 100",
        timeout=1.5,
    )
    assert result.timed_out and result.exit_code is None and result.error is None
    assert result.output == "started\n"
    assert living(pids(a, b)) == []


def test_a22_timeout_background_child_ignores_term(shell: ShellSession, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    result = shell.run(f"{STUBBORN.format(f=a)} & {CHILD.format(f=b)} & sleep 100", timeout=1.5)
    assert result.timed_out
    assert living(pids(a, b)) == []


def test_a22_timeout_foreground_child_ignores_term(shell: ShellSession, tmp_path: Path) -> None:
    a = tmp_path / "a"
    result = shell.run(STUBBORN.format(f=a), timeout=1.5)
    assert result.timed_out
    assert living(pids(a)) == []


def test_a22_shell_killed_with_two_children(shell: ShellSession, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shell.run("export KEPT=1")
    result = shell.run(
        f"{CHILD.format(f=a)} & {CHILD.format(f=b)} & {wait_files(a, b)}; kill -9 $$"
    )
    assert result.exit_code is None
    assert result.error is not None and "signal 9" in result.error
    assert living(pids(a, b)) == []
    assert shell.run("echo $KEPT").output == "1\n"


def test_a22_shell_exits_with_one_child(shell: ShellSession, tmp_path: Path) -> None:
    a = tmp_path / "a"
    result = shell.run(f"{CHILD.format(f=a)} & {wait_files(a)}; exit 3")
    # The agent's `exit 3` is the command's status, never 0; the shell is restarted.
    assert result.exit_code == 3
    assert result.error is not None and "exited" in result.error
    assert living(pids(a)) == []
    assert shell.run("echo ok").output == "ok\n"


def test_a22_shell_killed_while_child_holds_output_pipe(
    shell: ShellSession, tmp_path: Path
) -> None:
    a = tmp_path / "a"
    started = time.monotonic()
    # The child keeps the output pipe open: the answer must not wait for its end of file.
    result = shell.run(f"({CHILD.format(f=a)}; echo late) & {wait_files(a)}; kill -9 $$")
    assert time.monotonic() - started < 5
    assert result.error is not None
    assert living(pids(a)) == []


def test_a22_setsid_and_double_forked_children_die_on_timeout(
    shell: ShellSession, tmp_path: Path
) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    result = shell.run(
        f"setsid {CHILD.format(f=a)} & ( ( {CHILD.format(f=b)} & ) & ); "
        f"env -i sh -c 'echo $$ > {c}; exec sleep 1000' & sleep 100",
        timeout=1.5,
    )
    assert result.timed_out
    assert living(pids(a, b, c)) == []


def test_background_children_outlive_their_command_but_not_restart(
    shell: ShellSession, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert shell.run(f"{CHILD.format(f=a)} & {STUBBORN.format(f=b)} &").exit_code == 0
    children = pids(a, b)
    assert living(children, settle=0.1) == children
    shell.restart()
    assert living(children) == []


def test_earlier_background_job_survives_a_later_timeout(
    shell: ShellSession, tmp_path: Path
) -> None:
    early, late = tmp_path / "early", tmp_path / "late"
    shell.run(f"{CHILD.format(f=early)} &")
    (early_pid,) = pids(early)
    time.sleep(0.05)  # a later clock tick than the next command's start
    result = shell.run(f"{CHILD.format(f=late)} & sleep 100", timeout=1)
    assert result.timed_out
    assert living(pids(late)) == []
    assert alive(early_pid)
    shell.close()
    assert not alive(early_pid)


def test_timeout_keeps_the_session_usable(shell: ShellSession, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    shell.run("X=1; export E=2; g() { echo g; }; alias hi='echo alias'; shopt -s extglob")
    result = shell.run("cd d; echo partial; sleep 100", timeout=1)
    assert result.timed_out and result.output == "partial\n"
    after = shell.run("pwd; echo $X $E; g; hi; echo @(a|b)")
    assert after.exit_code == 0
    # cwd as at the timeout; variables, functions, aliases, shopt as of the last finished command
    assert after.output == f"{tmp_path}/d\n1 2\ng\nalias\n@(a|b)\n"


def test_timeout_sends_term_before_kill(shell: ShellSession, tmp_path: Path) -> None:
    note = tmp_path / "note"
    script = f"trap 'echo term > {note}; exit 0' TERM; while :; do sleep 0.05; done"
    result = shell.run(f'bash -c "{script}"', timeout=1)
    assert result.timed_out
    assert note.read_text() == "term\n"  # it had its grace to clean up


def test_close_during_a_command_ends_it(tmp_path: Path, env: dict[str, str]) -> None:
    session = ShellSession(str(tmp_path), env)
    results = []
    worker = threading.Thread(target=lambda: results.append(session.run("sleep 100")))
    worker.start()
    time.sleep(0.3)
    session.close()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert results[0].exit_code is None and results[0].error is not None


def test_errexit_ends_the_shell_and_is_not_restored(shell: ShellSession) -> None:
    shell.run("export KEPT=1")
    result = shell.run("set -e; false; echo unreachable")
    assert result.exit_code == 1 and result.error is not None
    assert result.output == ""
    assert shell.run("false; echo $KEPT").output == "1\n"


def test_xtrace_shows_the_command_not_the_protocol(shell: ShellSession) -> None:
    shell.run("set -x")
    traced = shell.run("echo a")
    pinged = shell.check_alive()  # a ping between commands is not traced into the next one
    after_ping = shell.run("echo c")
    shell.run("set +x")
    # One "+" per level of eval: the command runs two evals deep (the control line's and its
    # own), so its trace starts with "+++" where a terminal shows "+".
    assert traced.output.splitlines() == ["+++ echo a", "a"]
    assert pinged and after_ping.output.splitlines() == ["+++ echo c", "c"]
    assert shell.run("echo b").output == "b\n"


def test_verbose_echoes_the_command_not_the_protocol(shell: ShellSession) -> None:
    # It echoed the control line (with the command's nonce) before every later command.
    shell.run("set -v")
    echoed = shell.run("echo a")
    pinged = shell.check_alive()
    after_ping = shell.run("echo c")
    assert shell.run("set +v").output == "set +v\n"
    assert echoed.output == "echo a\na\n"
    assert pinged and after_ping.output == "echo c\nc\n"
    assert shell.run("echo b").output == "b\n"


def test_errexit_shell_runs_and_refuses_commands_and_keeps_the_option(
    shell: ShellSession,
) -> None:
    # A refused command ended the shell in the syntax check (a syntax error in a sourced file is
    # fatal under errexit), and bash's message was lost; the protocol's own steps, run outside
    # an && list now, must not trip errexit either (its read of the command ends at EOF: 1).
    shell.run("set -e")
    first_pid = shell.pid
    assert shell.run("echo a").output == "a\n"
    refused = shell.run("echo 'abc")
    assert refused.exit_code == 2 and refused.error is None
    assert "unexpected EOF" in refused.output
    assert shell.run("echo $-").output.strip().count("e") == 1
    assert shell.pid == first_pid
    # Under errexit the last status is not handed on ($? starts at 0): a non-zero return at
    # top level would end the shell before the command runs.
    assert shell.run("echo $?").output == "0\n"


def test_protocol_functions_and_fds_cannot_be_redefined(shell: ShellSession) -> None:
    # A no-op __dy_pre was kept by the snapshot: every later command, across recoveries, was
    # silently not run and answered "exit 0, no output".
    for attempt in ("__dy_pre() { :; }", "unset -f __dy_post", "__dy_L=true", "__dy_sfd=1"):
        refused = shell.run(attempt)
        assert refused.exit_code == 1 and "readonly" in refused.output, attempt
        assert shell.run("echo a").output == "a\n", attempt


def test_a_function_named_eval_changes_nothing(shell: ShellSession) -> None:
    # The protocol calls eval through `builtin`; the function is the agent's own business.
    shell.run("export KEPT=1")
    defined = shell.run("eval() { echo mine; }", timeout=1.0)
    after = shell.run("echo a", timeout=1.0)
    assert not defined.timed_out and after.output == "a\n" and not after.timed_out
    assert shell.run("eval echo x").output == "mine\n"
    assert shell.run("echo $KEPT").output == "1\n"


@pytest.mark.parametrize("name", ["local", "builtin"])
def test_a_function_shadowing_what_the_protocol_runs_costs_one_timeout(
    shell: ShellSession, name: str
) -> None:
    # bash finds functions before builtins. The snapshot kept such a function, so every later
    # command timed out, across recoveries; a recovery now drops it.
    shell.run("export KEPT=1")
    defined = shell.run(f"{name}() {{ :; }}", timeout=1.0)  # `builtin` stops this one's frame
    after = shell.run("echo a", timeout=1.0)  # `local` stops this one's
    assert [defined.timed_out, after.timed_out].count(True) == 1
    assert shell.run("echo $KEPT").output == "1\n"
    assert shell.run(f"type -t {name}").output == "builtin\n"
    assert shell.run("echo b").output == "b\n"


def test_a_broken_protocol_variable_costs_one_command(shell: ShellSession) -> None:
    # The per-command variables cannot be read-only; one set wrong breaks one command at most:
    # recovery resets them (the snapshot that brought them back is restored first).
    shell.run("export KEPT=1")
    broken = shell.run("__dy_skip=1", timeout=1.0)  # no frame for this command
    assert broken.timed_out
    assert shell.run("echo $KEPT").output == "1\n"
    forged = shell.run("__dy_n=" + "0" * 32)  # the frame then carries another nonce
    assert forged.exit_code is None and forged.error == "invalid frame: nonce of another command"
    assert shell.run("echo b").output == "b\n"


def test_timeout_kills_a_builtin_loop(shell: ShellSession) -> None:
    result = shell.run("while :; do :; done", timeout=0.5)
    assert result.timed_out
    assert shell.run("echo ok").output == "ok\n"


# -- A25: the status frame -------------------------------------------------------------------


def frame(status: str, kind: str = "ran", nonce: str = NONCE) -> bytes:
    return f"DY1 {nonce} {kind} {status} END\n".encode()


def test_a25_parser_accepts_a_whole_frame_in_any_chunking() -> None:
    data = frame("127")
    for size in (1, 2, 5, len(data)):
        parser = FrameParser(NONCE)
        results = [parser.feed(data[i : i + size]) for i in range(0, len(data), size)]
        assert results[-1] == Frame("ran", 127)
        assert all(r is None for r in results[:-1])


def test_a25_empty_status_is_invalid() -> None:
    with pytest.raises(InvalidFrame):
        FrameParser(NONCE).feed(frame(""))


def test_a25_status_in_a_second_read_is_reassembled() -> None:
    parser = FrameParser(NONCE)
    assert parser.feed(f"DY1 {NONCE} ran ".encode()) is None
    assert parser.feed(b"1 END\n") == Frame("ran", 1)


def test_a25_shell_dies_after_the_marker_before_the_status() -> None:
    parser = FrameParser(NONCE)
    assert parser.feed(f"DY1 {NONCE} ran ".encode()) is None
    with pytest.raises(IncompleteFrame):
        parser.finish()


def test_a25_shell_dies_after_12_of_127() -> None:
    parser = FrameParser(NONCE)
    assert parser.feed(f"DY1 {NONCE} ran 12".encode()) is None
    with pytest.raises(IncompleteFrame):
        parser.finish()


@pytest.mark.parametrize(
    "data",
    [
        frame("0", nonce="f" * 32),  # a stale or forged frame
        frame("256"),
        frame("01"),
        frame("-1"),
        frame("1", kind="done"),
        frame("0") + b"x",  # bytes after the terminator
        b"x" * 200,  # no terminator, ever
        b"\n",
    ],
)
def test_a25_malformed_frames_are_invalid(data: bytes) -> None:
    with pytest.raises(InvalidFrame):
        FrameParser(NONCE).feed(data)


def test_a25_nothing_received_then_eof_is_not_a_frame_error() -> None:
    assert FrameParser(NONCE).finish() is None  # the session reports the shell's exit instead


def test_a25_4053_bytes_then_failing_command_200_times(shell: ShellSession) -> None:
    statuses = [shell.run("head -c 4053 /dev/zero; false").exit_code for _ in range(200)]
    assert statuses == [1] * 200


# A real shell made to write a bad frame: an agent-defined `builtin` function intercepts the
# shell's `builtin printf` of the frame (once; a flag file stops it after that).
FORGE = """builtin() {{
  if [[ $1 == printf && ! -e {flag} ]]; then
    command touch {flag}
    {body}
  else
    command builtin "$@"
  fi
}}"""


def test_a25_end_to_end_empty_status_is_an_error_and_a_restart(
    shell: ShellSession, tmp_path: Path
) -> None:
    body = "command printf 'DY1 %s ran  END\\n' \"$3\" >&$__dy_sfd"
    shell.run("export KEPT=1")
    first_pid = shell.pid
    result = shell.run(FORGE.format(flag=tmp_path / "flag", body=body) + "\nfalse")
    assert result.exit_code is None
    assert result.error is not None and result.error.startswith("invalid frame")
    assert shell.pid != first_pid
    assert shell.run("false").exit_code == 1
    assert shell.run("echo $KEPT").output == "1\n"


def test_a25_end_to_end_status_in_a_second_write(shell: ShellSession, tmp_path: Path) -> None:
    body = (
        "command printf 'DY1 %s ran ' \"$3\" >&$__dy_sfd; command sleep 0.2; "
        "command printf '1 END\\n' >&$__dy_sfd"
    )
    result = shell.run(FORGE.format(flag=tmp_path / "flag", body=body) + "\nfalse")
    assert (result.exit_code, result.error) == (1, None)
    assert shell.run("echo next").output == "next\n"  # nothing leaked into the next command


def test_a25_end_to_end_shell_dies_mid_status(shell: ShellSession, tmp_path: Path) -> None:
    body = "command printf 'DY1 %s ran 12' \"$3\" >&$__dy_sfd; command kill -9 $$"
    result = shell.run(FORGE.format(flag=tmp_path / "flag", body=body) + "\n(exit 127)")
    assert result.exit_code is None
    assert result.error is not None and result.error.startswith("incomplete frame")
    assert shell.run("echo ok").output == "ok\n"


# -- A26: unterminated input is refused fast -------------------------------------------------

UNTERMINATED = {
    "heredoc into a file": "cat > out.txt <<EOF\nabc",
    "quoted heredoc into a file": "cat <<'EOF' > out.txt\nabc",
    "unbalanced quotes in a search": "grep -rn 'it's broken' . | head -5",
    "inline python left open": 'python3 -c "\nimport sys\nprint(sys.argv)',
    "unterminated single quote": "echo 'abc",
    "open command substitution": "x=$(echo hi",
}


@pytest.mark.parametrize("command", UNTERMINATED.values(), ids=UNTERMINATED.keys())
def test_a26_unterminated_input_is_refused_fast(
    shell: ShellSession, tmp_path: Path, command: str
) -> None:
    (tmp_path / "d").mkdir()
    shell.run("cd d; KEEP=yes")
    started = time.monotonic()
    result = shell.run(command, timeout=30)
    assert time.monotonic() - started < 1.0
    assert result.exit_code == 2 and not result.timed_out and result.error is None
    assert result.output.startswith("bash: line ")
    assert "unexpected EOF" in result.output or "delimited by end-of-file" in result.output
    assert not (tmp_path / "d" / "out.txt").exists()
    assert shell.run("pwd; echo $KEEP; echo $?").output == f"{tmp_path}/d\nyes\n0\n"


def test_a26_terminated_heredoc_runs(shell: ShellSession, tmp_path: Path) -> None:
    result = shell.run("cat > f.txt <<'EOF'\nabc $HOME\nEOF")  # no newline after the delimiter
    assert result.exit_code == 0
    assert (tmp_path / "f.txt").read_text() == "abc $HOME\n"


def test_a26_check_uses_the_sessions_shopt(shell: ShellSession) -> None:
    assert shell.run("echo @(a|b)").exit_code == 2
    shell.run("shopt -s extglob")
    assert shell.run("echo @(a|b)").output == "@(a|b)\n"


def test_a26_check_runs_nothing_and_reports_line_numbers(
    shell: ShellSession, tmp_path: Path
) -> None:
    result = shell.run("touch ran.txt\necho 'ok'\necho 'open")
    assert result.exit_code == 2
    assert "bash: line 3: unexpected EOF" in result.output
    assert not (tmp_path / "ran.txt").exists()


def test_a26_check_runs_in_the_shell_without_forking(shell: ShellSession) -> None:
    # The check parses inside the session's own shell; `set -n` never outlives it, the agent's
    # options are kept, and a syntax error in POSIX mode does not end the shell.
    shell.run("set -o posix; set -u; set -C")  # -C: the check's own writes must not clobber
    first = shell.pid
    assert shell.run("echo 'open").exit_code == 2  # in POSIX mode this would end a `source`r
    assert shell.run("echo 'closed'").output == "closed\n"
    assert shell.pid == first  # neither command needed a recovery
    assert shell.run("echo $-; shopt -o posix | tr -s ' \t' ' '").output == "hmuBCs\nposix on\n"


AGENT_OPTIONS = [
    "set -a", "set -k", "set -f", "set -b", "set -h", "set -B", "set +B", "set -C", "set -u",
    "set -x", "set -o pipefail", "set -o posix", "set -E; trap 'echo trapped' ERR", "IFS=:",
    "shopt -s failglob nullglob lastpipe extdebug globstar dotglob nocaseglob nocasematch",
]


@pytest.mark.parametrize("options", AGENT_OPTIONS)
def test_a26_check_works_under_any_agent_option(shell: ShellSession, options: str) -> None:
    # The check runs in the agent's shell, under the agent's options: none may stop it from
    # accepting a good command, refusing a bad one, or keeping state.
    shell.run(options)
    assert shell.run("echo hi").output.endswith("hi\n")
    assert shell.run("echo 'open").exit_code == 2
    assert shell.run("x=1; echo $x").output.endswith("1\n")


def test_a26_check_does_not_fork_per_command(shell: ShellSession, tmp_path: Path) -> None:
    # The kernel hands out pids in sequence: the gap between the pids of two children started
    # before and after 100 builtin-only commands counts the forks in between (plus whatever
    # else the machine started meanwhile). A fork per check would make it at least 100.
    before = int(shell.run("sh -c 'echo $$'").output)
    for _ in range(50):
        assert shell.run("x=1; y='two words'").exit_code == 0
        assert shell.run("echo 'open").exit_code == 2
    after = int(shell.run("sh -c 'echo $$'").output)
    assert 0 < after - before < 50


def test_a26_an_agent_function_named_builtin_does_not_leave_the_shell_parsing_only(
    shell: ShellSession,
) -> None:
    shell.run('builtin() { command builtin "$@"; }')
    assert shell.run("echo 'open").exit_code == 2
    assert shell.run("echo after").output == "after\n"


def test_a26_heredoc_warning_has_the_commands_line_numbers(shell: ShellSession) -> None:
    message = shell.run("cat <<EOF\nabc").output
    assert "here-document at line 1" in message


# -- A27: floods -----------------------------------------------------------------------------


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a27_64_mib_flood_keeps_memory_flat(shell: ShellSession) -> None:
    shell.run("true")
    before = rss_mib()
    result = shell.run("head -c 64M /dev/zero")
    growth = rss_mib() - before
    assert result.exit_code == 0
    assert result.output_bytes == 64 << 20 and result.truncated
    assert len(result.output) < 70 * 1024
    assert growth < 16, f"RSS grew {growth:.1f} MiB"


@pytest.mark.slow
def test_a27_1_gib_flood_keeps_memory_flat(shell: ShellSession) -> None:
    shell.run("true")
    before = rss_mib()
    result = shell.run("head -c 1G /dev/zero", timeout=120)
    growth = rss_mib() - before
    assert result.exit_code == 0 and result.output_bytes == 1 << 30
    assert growth < 32, f"RSS grew {growth:.1f} MiB"


@pytest.mark.slow
def test_a27_endless_printer_ends_at_its_timeout(shell: ShellSession) -> None:
    before = rss_mib()
    result = shell.run("yes", timeout=5)
    assert result.timed_out and result.exit_code is None and result.error is None
    assert result.output_bytes > 10 << 20 and result.truncated
    assert 5 <= result.duration_s < 8
    assert rss_mib() - before < 32
    assert shell.run("echo ok").output == "ok\n"


# -- liveness, restart, close ----------------------------------------------------------------


def test_check_alive_reports_a_stopped_shell(shell: ShellSession) -> None:
    shell.run("export KEPT=1")
    assert shell.check_alive()
    pid = shell.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.1)  # the stop is delivered
    started = time.monotonic()
    assert not shell.check_alive(within=2.0)
    assert time.monotonic() - started < 1.0  # seen in the process state, not as a late ping
    # The next command recovers the shell, state kept.
    assert shell.run("echo $KEPT").output == "1\n"
    assert shell.pid != pid and not alive(pid)
    assert shell.check_alive()


def test_a_stopped_and_continued_shell_is_alive(shell: ShellSession) -> None:
    pid = shell.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.1)
    os.kill(pid, signal.SIGCONT)
    time.sleep(0.1)
    assert shell.check_alive()
    assert shell.run("echo ok").output == "ok\n" and shell.pid == pid


def test_check_alive_on_a_busy_shell_reports_the_process(
    shell: ShellSession, tmp_path: Path
) -> None:
    worker = threading.Thread(target=shell.run, args=("sleep 1",))
    worker.start()
    time.sleep(0.3)
    assert shell.check_alive(within=0.1)
    worker.join()


def test_saved_state_waits_for_the_last_commands_snapshot(shell: ShellSession) -> None:
    # The frame is answered before the snapshot is written; a big state takes a while to write.
    shell.run("for i in {1..3000}; do declare v$i=$i; done")
    shell.run("LAST=yes")
    state = shell.saved_state()
    assert b'LAST="yes"' in state and b'v3000="3000"' in state


def test_latest_state_is_the_newest_complete_snapshot() -> None:
    older, newer = b"x=1\n# dockyard-state 7\n", b"x=2\n# dockyard-state 8\n"
    cut_off = b"x=3\ndeclare -- y="  # the shell was killed while writing snapshot 9
    assert latest_state([older, newer]) == latest_state([newer, older]) == newer
    assert latest_state([cut_off, newer]) == newer
    assert latest_state([b"", b""]) == b""


def test_a_bash_older_than_4_4_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    # Such a bash fails the bootstrap's version gate and exits 97 (BASH_VERSINFO is read-only,
    # so an old bash is played by a script that exits the way the gate makes it exit).
    fake = tmp_path / "bin" / "bash"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 97\n")
    fake.chmod(0o755)
    with pytest.raises(ShellStartError, match="bash 4.4 or later is needed"):
        ShellSession(cwd=str(tmp_path), env={"PATH": f"{fake.parent}:{os.defpath}"})


def test_restart_loses_state_and_changes_directory(shell: ShellSession, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    shell.run("X=1; cd d")
    shell.restart(cwd=str(tmp_path / "d"))
    assert shell.run("echo ${X:-unset}; pwd").output == f"unset\n{tmp_path}/d\n"


def test_stop_processes_kills_everything_and_keeps_the_state(
    shell: ShellSession, tmp_path: Path
) -> None:
    """What finish does before capturing: every process of the session ends, nothing of the
    shell's state is lost, and the next command runs in a shell started from it."""
    (tmp_path / "d").mkdir()
    a = tmp_path / "a"
    shell.run(f"export X=kept; cd d; {CHILD.format(f=a)} &")
    shell_pid = shell.pid
    (child,) = pids(a)
    shell.stop_processes()
    assert shell_pid is not None and not alive(shell_pid) and not alive(child)
    assert shell.run("echo $X; pwd").output == f"kept\n{tmp_path}/d\n"
    assert shell.pid != shell_pid


def test_close_is_idempotent_and_leaves_no_fds_or_processes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))
    session = ShellSession(str(tmp_path), env)
    a = tmp_path / "a"
    session.run(f"{CHILD.format(f=a)} &")
    shell_pid = session.pid
    (child,) = pids(a)
    session.close()
    session.close()
    assert shell_pid is not None and not alive(shell_pid) and not alive(child)
    assert set(os.listdir("/proc/self/fd")) == fds_before
    with pytest.raises(SessionClosed):
        session.run("true")
    assert not session.check_alive()
    assert session.cwd() is None
