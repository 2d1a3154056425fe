"""Grading one patch: fresh tree, setup, agent patch, gold test patch, tests, verdict.

Single-shot submissions and session finishes both come through ``Grader.grade``, so the same patch
gets the same verdict either way. Nothing here knows about HTTP.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_client.protocol import (
    GradingSpec,
    PhaseTimings,
    RequiredConditions,
    RunConditions,
    TaskResult,
    TaskSpec,
    TestSplit,
    template_key,
)
from task_executor.config import Settings
from task_executor.errors import InvalidRequest, RepoError
from task_executor.sandbox.command import run_command
from task_executor.workspaces.workspace import SetupFailed, Workspace, WorkspaceFactory

from . import canaries, planting, swebench_rules
from .conditions import ConditionProbe, ConditionsMismatch, check
from .consistency import RunEvidence, attribute, problems
from .control import ControlCache, control_key
from .diffs import split_patch
from .images import expect_image
from .patching import (
    PATCH_STEP_TIMEOUT_S,
    AgentPatchFailed,
    PatchStepFailed,
    TestPatchFailed,
    apply_patches,
)
from .results import read_report
from .tampering import exit_problem, tampering

log = logging.getLogger(__name__)

REPORTER_DIR = Path(__file__).resolve().parent / "reporter"
OWNER_VARIABLE = "DOCKYARD_EXECUTOR"
REPORTER_VARIABLE = "DOCKYARD_REPORTER_DIR"
"""Where code under test finds the reporter plugin (a read-only mount in the sandbox)."""
CODE_FILES_VARIABLE = "DOCKYARD_CODE_FILES"
"""The test files (and their SHA-256) whose code the reporter checks (``code_check``)."""


@dataclass
class GradingJob:
    """Everything one grading needs; built from a TaskSpec or from a finished session."""

    task_id: str
    repo: str
    base_commit: str
    patch: str
    spec: GradingSpec
    setup: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    deny_network: bool | None = None
    """None: the executor's default (deny whenever the egress guard is available)."""
    conditions: RequiredConditions | None = None
    image: str | None = None
    """The task image the spec names (None: the host's root)."""

    @classmethod
    def from_task(cls, spec: TaskSpec) -> GradingJob:
        return cls(
            task_id=spec.task_id,
            repo=spec.repo,
            base_commit=spec.base_commit,
            patch=spec.patch_text(),
            spec=spec,
            setup=list(spec.setup),
            env=dict(spec.env),
            deny_network=spec.deny_network,
            conditions=spec.conditions,
            image=spec.image,
        )


class _Verdict(Exception):
    """Ends a grading early with a final status (raised inside ``Grader._run``)."""

    def __init__(self, status: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def test_patch_files(spec: GradingSpec) -> list[str]:
    """The Python files the test patch leaves in place."""
    _, sections = split_patch(spec.test_patch)
    return sorted({s.new_path for s in sections if s.new_path and s.new_path.endswith(".py")})


def default_test_command(spec: GradingSpec) -> str:
    """pytest over the Python files the test patch leaves in place (else the named test files)."""
    files = test_patch_files(spec)
    if not files:
        named = [test.split("::", 1)[0] for test in [*spec.fail_to_pass, *spec.pass_to_pass]]
        files = sorted({name for name in named if name.endswith(".py")})
    return " ".join(["python -m pytest -p no:cacheprovider", *map(shlex.quote, files)])


def canary_plan(spec: GradingSpec) -> canaries.Plan:
    """The canaries of one grading of ``spec``, and the test command that runs them."""
    command = spec.test_command or default_test_command(spec)
    if spec.rules == "swebench":
        # The harness's rules read the exit status, which failing canaries would set.
        return canaries.Plan(command, skipped="rules: swebench (the harness's own verdict)",
                             required=[*spec.fail_to_pass, *spec.pass_to_pass])
    return canaries.plan(test_patch_files(spec), spec.fail_to_pass, spec.pass_to_pass, command,
                         log_parser_for(spec, command), default_command=not spec.test_command)


def log_parser_for(spec: GradingSpec, command: str) -> str:
    if spec.log_parser:
        return spec.log_parser
    return "django" if "runtests.py" in command else "pytest"


def owner_token(base_dir: Path) -> str:
    """An opaque name for the executor owning ``base_dir`` (its processes carry it; it names no
    path code under test could go looking for)."""
    return hashlib.sha256(str(base_dir.resolve()).encode()).hexdigest()[:16]


def sandbox_env(
    settings: Settings, reporter: str | None, tmp: str, extra: Mapping[str, str]
) -> dict[str, str]:
    """The environment of code under test: built from scratch, never the executor's own.

    The executor's token and settings live in its environment; none of it is passed on. PATH is
    the task image's (``task_path``), never the executor's venv.
    """
    env = {
        # Every process this executor starts carries its token, so a restarted or
        # shutting-down executor can find and kill everything it (or its predecessor) left.
        OWNER_VARIABLE: owner_token(settings.base_dir),
        "PATH": settings.task_path,
        "HOME": f"{tmp}/home",
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    if reporter is not None:
        env[REPORTER_VARIABLE] = reporter
    env.update(extra)
    return env


class Grader:
    """Grades jobs in workspaces made by ``workspaces``."""

    def __init__(self, settings: Settings, workspaces: WorkspaceFactory) -> None:
        self.settings = settings
        self.workspaces = workspaces
        self.controls = ControlCache()
        run_as = None if settings.run_as_uid is None else (
            settings.run_as_uid,
            settings.run_as_uid if settings.run_as_gid is None else settings.run_as_gid)
        self.probe = ConditionProbe(workspaces, settings.memory_limit_bytes, run_as,
                                    settings.shm_bytes)

    def default_denies_network(self) -> bool:
        if self.settings.deny_network is None:
            return self.workspaces.sandbox.can_deny_network
        return self.settings.deny_network

    def resolve_deny_network(self, requested: bool | None) -> bool:
        """Whether code under test runs without network; fails closed (4xx) when it cannot."""
        wanted = requested if requested is not None else self.default_denies_network()
        if wanted and not self.workspaces.sandbox.can_deny_network:
            raise InvalidRequest(
                "egress denial was requested but this executor cannot provide it "
                "(no network namespaces); see /health",
                code="egress_guard_unavailable",
            )
        return wanted

    def deny_for(self, requested: bool | None, required: RequiredConditions | None) -> bool:
        """Whether code under test runs without network: as requested, else as the declared
        conditions' ``egress`` says (409 when that cannot be given here), else the default."""
        if requested is None and required is not None and required.egress is not None:
            if not required.egress and not self.workspaces.sandbox.can_deny_network:
                raise ConditionsMismatch("this executor cannot give the declared conditions: "
                                         "egress: required False, here egress cannot be denied")
            requested = not required.egress
        return self.resolve_deny_network(requested)

    def expect_conditions(self, required: RequiredConditions | None, key: str,
                          env: dict[str, str], deny_network: bool) -> None:
        """Refuse (409) before any work what this executor knows it cannot give."""
        check(required, self.probe.expected(key, env, deny_network), measured=False)

    def conditions_in(self, required: RequiredConditions | None, key: str,
                      workspace: Workspace, env: dict[str, str],
                      deny_network: bool) -> RunConditions:
        """The conditions in a fresh ``workspace`` (probed once per template), checked."""
        conditions = self.probe.measure(key, workspace, env, deny_network)
        check(required, conditions, measured=True)
        return conditions

    def expect_image(self, requested: str | None) -> None:
        """Refuse (421 image_mismatch) work for an image this executor does not run."""
        expect_image(self.settings.image, requested)

    def admit(self, job: GradingJob) -> bool:
        """Refuse (4xx) before any work a job that cannot be graded here: another task image
        (421), no tests, egress denial this executor cannot give, conditions it knows it cannot
        meet. Returns whether the tests run without network."""
        self.expect_image(job.image)
        if not job.spec.fail_to_pass and not job.spec.pass_to_pass:
            raise InvalidRequest(
                "fail_to_pass and pass_to_pass are both empty: nothing to grade", code="no_tests"
            )
        deny_network = self.deny_for(job.deny_network, job.conditions)
        key = template_key(job.repo, job.base_commit, job.setup, job.env)
        self.expect_conditions(job.conditions, key, job.env, deny_network)
        return deny_network

    def grade(self, job: GradingJob) -> TaskResult:
        """The verdict on ``job``; RepoError (an unknown repo or commit) and ConditionsMismatch
        (409) propagate."""
        deny_network = self.admit(job)
        key = template_key(job.repo, job.base_commit, job.setup, job.env)
        started = time.monotonic()
        timeout = self.wall_clock(job)
        result = TaskResult(task_id=job.task_id, status="execution_error", resolved=None,
                            rules=job.spec.rules or "strict")
        phases = PhaseTimings()
        workspace: Workspace | None = None
        log_parts: list[str] = []
        plan = canary_plan(job.spec)
        try:
            mark = time.monotonic()
            workspace = self.workspaces.create(job.repo, job.base_commit, job.setup, job.env)
            result.template_hit = workspace.template_hit
            # Setup runs inside create: per workspace in git-clone mode, once per template else.
            phases.setup = workspace.setup_s
            phases.checkout = time.monotonic() - mark - workspace.setup_s
            result.conditions = self.conditions_in(job.conditions, key, workspace, job.env,
                                                   deny_network)
            self._run(job, workspace, started + timeout, result, phases, log_parts, deny_network,
                      plan)
        except _Verdict as verdict:
            result.status = verdict.status  # type: ignore[assignment]
            result.resolved = None if verdict.status == "execution_error" else False
            result.error, result.error_code = str(verdict), verdict.code
        except (RepoError, ConditionsMismatch):
            raise
        except SetupFailed as exc:
            result.status, result.resolved = "execution_error", None
            result.error, result.error_code = str(exc), exc.code
        except Exception as exc:
            log.exception("grading %s failed", job.task_id)
            result.status, result.resolved = "execution_error", None
            # The type only: the message of an OSError names host paths (the log has it all).
            result.error = f"internal error ({type(exc).__name__}; see the executor log)"
            result.error_code = "internal_error"
        finally:
            if workspace is not None:
                mark = time.monotonic()
                workspace.destroy()
                phases.cleanup = time.monotonic() - mark
            result.phases = PhaseTimings(
                **{name: round(seconds, 4) for name, seconds in phases.model_dump().items()}
            )
            result.duration_s = round(time.monotonic() - started, 4)
            # The canaries' names never reach the agent: a run's log and messages cite them.
            result.log = (plan.scrub("".join(log_parts)) or "")[-self._log_limits(job)[2] :]
            result.error = plan.mask(result.error)
            result.canaries = len(plan.canaries) if plan.planted else 0
            result.canaries_skipped = plan.skipped
            log.info(
                "task %s status=%s duration=%.2fs", job.task_id, result.status, result.duration_s
            )
        return result

    def wall_clock(self, job: GradingJob) -> float:
        return job.spec.timeout or self.settings.task_timeout

    def _run(
        self,
        job: GradingJob,
        workspace: Workspace,
        deadline: float,
        result: TaskResult,
        phases: PhaseTimings,
        log_parts: list[str],
        deny_network: bool,
        plan: canaries.Plan,
    ) -> None:
        mark = time.monotonic()
        step_timeout = min(PATCH_STEP_TIMEOUT_S, max(1.0, deadline - mark))
        try:
            agent = apply_patches(workspace, job.patch, job.spec.test_patch, step_timeout)
        except AgentPatchFailed as exc:
            log_parts.append(f"[agent patch failed to apply]\n{exc}\n")
            raise _Verdict("patch_apply_failed", "patch_apply_failed", str(exc)) from exc
        except TestPatchFailed as exc:
            raise self._blame_for_test_patch(job, exc, log_parts) from exc
        except PatchStepFailed as exc:
            raise _Verdict("execution_error", "sandbox_failed", str(exc)) from exc
        result.patch_applied = agent.applied
        result.excluded_files = agent.excluded_files
        # Canaries and the code check read the test files now: the test patch's bytes, before
        # any code of the agent's has run.
        plan.planted = plan.skipped is None and planting.plant(workspace, plan)
        if plan.skipped is None and not plan.planted:
            plan.skipped = "the test patch's files could not take the canaries"
        plan.code_files = planting.digests(workspace, test_patch_files(job.spec))
        # git and patch ran with the workspace's credentials: what they wrote is its already.
        phases.apply = time.monotonic() - mark

        command = job.spec.test_command or default_test_command(job.spec)
        parser = log_parser_for(job.spec, command)
        mark = time.monotonic()
        # The command that also runs the canaries; the control (none planted) runs ``command``.
        run = self._run_tests(job, plan.command if plan.planted else command, parser,
                              workspace, deadline, log_parts, deny_network, plan.code_files)
        phases.tests = time.monotonic() - mark
        if job.spec.rules == "swebench":
            return _judge_swebench(job, run, result, plan)  # the harness's rules, no control
        _record(job, run, result, plan)
        if run.timed_out:
            raise _Verdict("timeout", "test_timeout", "tests ran past the wall clock")
        required = [*job.spec.fail_to_pass, *job.spec.pass_to_pass]
        own = problems(run, required)
        if (forced := exit_problem(plan, run)) is not None and forced.code not in {
                p.code for p in own}:
            own.append(forced)
        key = control_key(self._template_key(job, workspace), job.spec.test_patch, command,
                          parser, deny_network, self.wall_clock(job))
        if not job.patch.strip():
            self.controls.offer(key, run)  # without a patch, this run *is* the control
        # A run that reported its tests but not its canaries as planted was tampered with,
        # whatever else it shows; of a crashed one only what the record saw counts here.
        _check_tampering(plan, run, job.task_id, crashed=bool({p.code for p in own} & _CRASHES))
        if own:
            # No consistent verdict: the control (no agent patch) says whose fault that is.
            mark = time.monotonic()
            control, result.control_run = self.controls.get(
                key, lambda: self._control_run(job, command, parser, deny_network))
            phases.control = time.monotonic() - mark
            verdict = attribute(own, control, required)
            log_parts.append(
                f"\n[no consistent verdict: {plan.mask(own[0].message)}; control run without "
                f"the agent's patch ({'run now' if result.control_run else 'kept'}): exit status "
                f"{control.exit_code}, {len(control.report.states)} tests reported]\n")
            if verdict.status is not None:
                if verdict.status == "execution_error":
                    log_parts.append(f"[control run output, tail]\n{control.tail}\n")
                raise _Verdict(verdict.status, verdict.code, verdict.message)
        _check_tampering(plan, run, job.task_id)
        resolved = all(result.tests[name] == "PASSED" for name in required)
        result.status = "resolved" if resolved else "unresolved"
        result.resolved = resolved

    def _template_key(self, job: GradingJob, workspace: Workspace) -> str:
        if workspace.template is not None:
            return workspace.template.key
        source = self.workspaces.mirrors.source_of(job.repo)
        return template_key(source, workspace.base_commit, job.setup, job.env)

    def _blame_for_test_patch(
        self, job: GradingJob, failure: TestPatchFailed, log_parts: list[str]
    ) -> _Verdict:
        """The test patch did not apply after the agent's: whose fault is that? The agent's
        when it applies to base_commit alone, in a fresh tree of the same template (a patch may
        fill the disk quota, or take the step's time, and must not earn "no verdict" by it);
        else the task's."""
        if job.patch.strip():
            workspace = self.workspaces.create(job.repo, job.base_commit, job.setup, job.env)
            try:
                apply_patches(workspace, "", job.spec.test_patch)
            except TestPatchFailed:
                pass  # the task's: below
            except PatchStepFailed as exc:
                return _Verdict("execution_error", "sandbox_failed", str(exc))
            else:
                log_parts.append(f"[the test patch applies to base_commit alone, not after the "
                                 f"agent's patch]\n{failure}\n")
                return _Verdict("patch_apply_failed", "patch_blocks_test_patch",
                                f"the test patch applies without the agent's patch, not after "
                                f"it: {failure}")
            finally:
                workspace.destroy()
        return _Verdict("execution_error", "test_patch_failed", f"test patch: {failure}")

    def _control_run(
        self, job: GradingJob, command: str, parser: str, deny_network: bool
    ) -> RunEvidence:
        """The task's tests without the agent's patch, in a fresh workspace of the same
        template, with a wall clock of their own (the agent's run cannot use it up)."""
        workspace = self.workspaces.create(job.repo, job.base_commit, job.setup, job.env)
        try:
            _apply_test_patch(workspace, job)
            deadline = time.monotonic() + self.wall_clock(job)
            return self._run_tests(job, command, parser, workspace, deadline, [], deny_network)
        finally:
            workspace.destroy()

    def _log_limits(self, job: GradingJob) -> tuple[int, int, int]:
        """(head, tail) of the test output kept, and the log's own cap: the default tail, or
        what ``log_bytes`` asks, up to ``max_log_bytes``, plus room for setup's and apply's."""
        wanted = job.spec.log_bytes
        if wanted is None:
            return 16 * 1024, 48 * 1024, self.settings.log_tail_bytes
        kept = min(wanted, self.settings.max_log_bytes)
        return kept // 4, kept - kept // 4, kept + self.settings.log_tail_bytes

    def _run_tests(
        self,
        job: GradingJob,
        command: str,
        parser: str,
        workspace: Workspace,
        deadline: float,
        log_parts: list[str],
        deny_network: bool,
        code_files: dict[str, str] | None = None,
    ) -> RunEvidence:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Verdict("timeout", "tests_timeout", "no time left for tests")
        report_name = f"report-{uuid.uuid4().hex}.jsonl"
        env = workspace.sandbox_env(job.env)
        test_env = dict(env)
        test_env["DOCKYARD_REPORT_FILE"] = f"{workspace.visible_tmp}/{report_name}"
        test_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get(REPORTER_VARIABLE, str(REPORTER_DIR)), env.get("PYTHONPATH", ""))
            if p
        )
        if parser == "pytest":
            test_env["PYTEST_PLUGINS"] = "dockyard_report"
            test_env["DOCKYARD_REPORT_MODE"] = "pytest"
        else:
            test_env["DOCKYARD_REPORT_MODE"] = "unittest"
        if code_files:  # relative to the tree as the tests see it (a command may cd elsewhere)
            test_env[CODE_FILES_VARIABLE] = json.dumps({"root": workspace.visible_path,
                                                        "files": code_files})
        head, tail, _ = self._log_limits(job)
        outcome = run_command(
            command,
            cwd=str(workspace.path),
            env=test_env,
            timeout=remaining,
            launcher=workspace.launcher(deny_network),
            head=head,
            tail=tail,
        )
        log_parts.append(f"$ {command}\n{outcome.output}")
        if outcome.timed_out:
            log_parts.append(f"\n[tests killed after {outcome.duration_s:.1f}s wall clock]\n")
        report = read_report(workspace.tmp, report_name)
        return RunEvidence.of(report, outcome.exit_code, outcome.timed_out, parser, outcome.output)


def _apply_test_patch(workspace: Workspace, job: GradingJob) -> None:
    try:
        apply_patches(workspace, "", job.spec.test_patch)
    except TestPatchFailed as exc:
        raise _Verdict("execution_error", "test_patch_failed", f"test patch: {exc}") from exc
    except PatchStepFailed as exc:
        raise _Verdict("execution_error", "sandbox_failed", str(exc)) from exc


_CRASHES = {"tests_crashed", "no_tests_reported"}


def _check_tampering(plan: canaries.Plan, run: RunEvidence, task_id: str,
                     crashed: bool = False) -> None:
    """``unresolved`` with ``tampered`` when the canaries or the integrity record say so."""
    found = tampering(plan, run.report, run.parser, crashed)
    plan.clean = plan.planted and found is None
    if found is not None:
        log.warning("task %s tampered: %s (canaries %s)", task_id, found,
                    [(c.label, c.fails) for c in plan.canaries])
        raise _Verdict("unresolved", "tampered", f"the test run was tampered with: {found}")


def _record(job: GradingJob, run: RunEvidence, result: TaskResult,
            plan: canaries.Plan) -> None:
    """Per-test states of the run into ``result``, canaries left out; a required test not
    reported is MISSING."""
    tests = {name: state for name, state in run.report.states.items()
             if not plan.is_canary(name)}
    for name in [*job.spec.fail_to_pass, *job.spec.pass_to_pass]:
        tests[name] = run.report.lookup(name)
        alias_target = run.report.aliases.get(name)
        if alias_target is not None and alias_target != name:
            tests.pop(alias_target, None)
    result.tests = tests
    result.test_exit_code = run.exit_code
    result.fail_to_pass = _split(job.spec.fail_to_pass, tests)
    result.pass_to_pass = _split(job.spec.pass_to_pass, tests)


def _judge_swebench(job: GradingJob, run: RunEvidence, result: TaskResult,
                    plan: canaries.Plan) -> None:
    """SWE-bench's harness rules (``swebench_rules``): its status map, report and resolution."""
    f2p, p2p = job.spec.fail_to_pass, job.spec.pass_to_pass
    statuses = swebench_rules.status_map(run.report, [*f2p, *p2p])
    judged = swebench_rules.judge(statuses, f2p, p2p, run.exit_code or 0)
    result.tests = judged.tests  # type: ignore[assignment]
    result.test_exit_code = run.exit_code
    result.fail_to_pass = TestSplit(passed=judged.report["FAIL_TO_PASS"]["success"],
                                    failed=judged.report["FAIL_TO_PASS"]["failure"])
    result.pass_to_pass = TestSplit(passed=judged.report["PASS_TO_PASS"]["success"],
                                    failed=judged.report["PASS_TO_PASS"]["failure"])
    if run.timed_out:
        raise _Verdict("timeout", "test_timeout", "tests ran past the wall clock")
    if judged.problem is not None:
        raise _Verdict("unresolved", *judged.problem)
    _check_tampering(plan, run, job.task_id)
    result.status = "resolved" if judged.resolved else "unresolved"
    result.resolved = judged.resolved


def _split(names: list[str], tests: Mapping[str, str]) -> TestSplit:
    return TestSplit(
        passed=[n for n in names if tests.get(n) == "PASSED"],
        failed=[n for n in names if tests.get(n) != "PASSED"],
    )
