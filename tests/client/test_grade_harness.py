"""``dockyard grade`` as a SWE-bench user expects it: fail fast on an unusable fleet, errors
summed up by reason, per-instance log directories, ``--run-id``, ``--instance-ids``,
``--predictions gold``, ``--specs``, the resume line, ``--version``, a quiet second Ctrl-C."""

from __future__ import annotations

import configparser
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_client.cli import main
from task_executor.demo import DemoTask

from .conftest import RawServer, demo_instance, read_request

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def grade(tmp_path: Path, url: str, instances: list[dict[str, Any]], predictions: Any,
          *extra: str) -> tuple[int, dict[str, Any] | None]:
    """Run ``dockyard grade`` in-process; (exit status, the report or None)."""
    files = write(tmp_path / "instances.jsonl", instances)
    if isinstance(predictions, list):
        predictions = str(write(tmp_path / "predictions.jsonl", predictions))
    report = tmp_path / "out" / "report.json"
    argv = ["grade", "--instances", str(files), "--predictions", predictions, "--urls", url,
            "--output", str(report), *extra]
    status = main(argv)
    return status, json.loads(report.read_text()) if report.exists() else None


def prediction(iid: str, patch: str, model: str = "org/model-7b") -> dict[str, Any]:
    return {"instance_id": iid, "model_patch": patch, "model_name_or_path": model}


# -- fail fast ----------------------------------------------------------------------------------


def test_a_refused_token_stops_the_run_before_any_task(
    executor_factory: Any, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guarded = executor_factory(token="right")
    instances = [demo_instance(demo_task, f"i{n}") for n in range(3)]
    preds = [prediction(f"i{n}", demo_task.gold_patch) for n in range(3)]
    status, report = grade(tmp_path, guarded.url, instances, preds, "--token", "wrong")
    err = capsys.readouterr().err
    assert status == 2 and report is None
    assert "executors refused the token (401 unauthorized)" in err and "--token" in err
    assert "grading" not in err and "not_graded" not in err  # not one task was sent


def test_no_executor_reachable_stops_the_run(
    closed_port_url: str, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = grade(tmp_path, closed_port_url, [demo_instance(demo_task, "a")],
                           [prediction("a", demo_task.gold_patch)])
    assert status == 2 and report is None
    assert "no executor reachable" in capsys.readouterr().err


def test_every_repository_unknown_stops_after_one_grading_per_repository(
    executor: Any, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong --repo-root: the first instance of each of the two repositories is graded
    (unknown_repo both), the other four are never sent."""
    instances = [demo_instance(demo_task, f"{repo}-{n}", repo=f"owner/{repo}")
                 for repo in ("one", "two") for n in range(3)]
    preds = [prediction(r["instance_id"], demo_task.gold_patch) for r in instances]
    status, report = grade(tmp_path, executor.url, instances, preds,
                           "--repo-root", str(tmp_path / "no-such-root"))
    err = capsys.readouterr().err
    assert status == 2 and report is not None
    assert "every instance's repository is unknown to the executors" in err
    assert "--repo-root" in err
    assert sorted(report["instances"]) == ["one-0", "two-0"]
    assert {e["error_code"] for e in report["instances"].values()} == {"unknown_repo"}
    assert len(report["ungraded_ids"]) == 4
    assert "error unknown_repo: 2 (e.g. one-0:" in err and "error not_graded: 4" in err


# -- a completed run: summary, logs, ids, gold ------------------------------------------------


def test_log_dirs_error_summary_and_swebench_ids(
    executor: Any, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    instances = [
        demo_instance(demo_task, "gold"),
        demo_instance(demo_task, "empty"),
        demo_instance(demo_task, "bad-commit", base_commit="0" * 40),
        demo_instance(demo_task, "no-prediction"),
        demo_instance(demo_task, "not-selected"),
    ]
    preds = [prediction("gold", demo_task.gold_patch), prediction("empty", ""),
             prediction("bad-commit", demo_task.gold_patch),
             prediction("not-selected", demo_task.gold_patch)]
    status, report = grade(
        tmp_path, executor.url, instances, preds, "--run-id", "run-7", "--max-error-retries", "0",
        "--instance-ids", "gold", "empty", "bad-commit", "no-prediction",
    )
    out, err = capsys.readouterr()
    assert status == 1 and report is not None  # bad-commit has no verdict
    assert report["total_instances"] == 4 and report["submitted_instances"] == 3
    assert report["incomplete_ids"] == ["no-prediction"]  # SWE-bench's: no prediction
    assert report["resolved_ids"] == ["gold"] and report["empty_patch_ids"] == ["empty"]
    assert report["error_ids"] == ["bad-commit"] and report["ungraded_ids"] == []
    assert report["error_reasons"] == {"unknown_commit": 1}
    assert "error unknown_commit: 1 (e.g. bad-commit:" in err
    assert report["run"]["run_id"] == "run-7"

    logs = tmp_path / "out" / "logs"
    assert f"(logs: {logs / 'run-7'})" in out
    gold = logs / "run-7" / "org__model-7b" / "gold"
    files = sorted(p.name for p in gold.iterdir())
    assert files == ["patch.diff", "report.json", "test_output.txt"]
    assert gold.joinpath("patch.diff").read_text() == demo_task.gold_patch
    per_instance = json.loads(gold.joinpath("report.json").read_text())["gold"]
    assert per_instance["resolved"] is True
    assert per_instance["tests_status"] == report["instances"]["gold"]["tests_status"]
    output = gold.joinpath("test_output.txt").read_text()
    assert "$ python -m pytest" in output and "5 passed" in output
    failed = logs / "run-7" / "org__model-7b" / "bad-commit"
    assert not failed.joinpath("report.json").exists()  # as in the harness: no verdict, no report
    assert "[no verdict: unknown_commit]" in failed.joinpath("test_output.txt").read_text()
    assert not (logs / "run-7" / "org__model-7b" / "empty").exists()  # not graded, as there


def test_the_test_log_is_whole_not_a_tail(
    executor: Any, demo_task: DemoTask, tmp_path: Path
) -> None:
    noisy = "seq -f 'noise line %06g' 1 20000; python -m pytest -p no:cacheprovider tests"
    status, _ = grade(tmp_path, executor.url, [demo_instance(demo_task, "a", test_command=noisy)],
                      [prediction("a", demo_task.gold_patch, model="")])
    output = (tmp_path / "out" / "logs" / "report" / "none" / "a" / "test_output.txt").read_text()
    assert status == 0 and "bytes omitted" not in output
    assert "noise line 000001" in output and "noise line 020000" in output and "5 passed" in output


def test_gold_predictions_and_the_resume_line(
    executor: Any, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    instances = [demo_instance(demo_task, n) for n in ("a", "b")]
    status, report = grade(tmp_path, executor.url, instances, "gold")
    assert status == 0 and report is not None and report["resolved_ids"] == ["a", "b"]
    assert (tmp_path / "out/logs/report/gold/a/report.json").is_file()
    capsys.readouterr()
    status, _ = grade(tmp_path, executor.url, instances, "gold")  # no -v
    assert status == 0 and "resuming: 2 of 2 instances already graded" in capsys.readouterr().err
    del instances[0]["patch"]
    assert grade(tmp_path, executor.url, instances, "gold")[0] == 2
    assert "--predictions gold: 1 instances have no patch: a" in capsys.readouterr().err


# -- --specs ------------------------------------------------------------------------------------


def test_specs_give_a_swebench_dataset_its_setup_and_test_command(
    executor: Any, demo_task: DemoTask, tmp_path: Path
) -> None:
    """Instances as SWE-bench ships them (owner/name, a version, no setup or test_command): the
    specs file supplies them per repository and version."""
    instances = [
        {**demo_instance(demo_task, "v1", repo="acme/calc", version="1.0"), "env": {}},
        {**demo_instance(demo_task, "v2", repo="acme/calc", version="2.0"), "env": {}},
    ]
    specs = {
        "*": {"env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "WHO": "everyone"}},
        "acme/calc": {
            "setup": "echo built > .built",
            "test_command": "echo \"spec for $CALC_VERSION, $(cat .built)\"; "
                            "python -m pytest -p no:cacheprovider {test_files}",
            "versions": {"2.0": {"env": {"CALC_VERSION": "two"}}},
            "env": {"CALC_VERSION": "any"},
        },
    }
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    template = str(Path(demo_task.repo).parent / "{name}")
    Path(demo_task.repo).rename(Path(demo_task.repo).parent / "calc")
    preds = [prediction(i, demo_task.gold_patch) for i in ("v1", "v2")]
    status, report = grade(
        tmp_path, executor.url, instances, preds, "--specs", str(tmp_path / "specs.json"),
        "--repo-url-template", template,
    )
    assert status == 0 and report is not None and report["resolved_ids"] == ["v1", "v2"]
    logs = tmp_path / "out/logs/report/org__model-7b"
    assert "spec for any, built" in (logs / "v1/test_output.txt").read_text()
    v2 = (logs / "v2/test_output.txt").read_text()
    assert "spec for two, built" in v2 and "pytest -p no:cacheprovider tests/test_calc.py" in v2


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ({"a/b": {"install": "x"}}, "a/b: unknown field install"),
        ({"a/b": {"versions": {"1": {"versions": {}}}}}, "a/b version 1: unknown field versions"),
        ({"a/b": {"setup": 3}}, "setup must be a command or a list"),
        ([], "a JSON object keyed by owner/name"),
    ],
)
def test_bad_specs_are_input_errors(
    specs: Any, message: str, demo_task: DemoTask, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    status, _ = grade(tmp_path, "http://127.0.0.1:9", [demo_instance(demo_task, "a")],
                      [prediction("a", "x")], "--specs", str(tmp_path / "specs.json"))
    assert status == 2 and message in capsys.readouterr().err


# -- console scripts ----------------------------------------------------------------------------


def console_scripts() -> list[tuple[str, str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["options.entry_points"]["console_scripts"].strip().splitlines()
    return [tuple(part.strip() for part in line.split("=")) for line in lines]  # type: ignore[misc]


@pytest.mark.parametrize(("name", "target"), console_scripts())
def test_every_console_script_has_version(
    name: str, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module, function = target.split(":")
    entry = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as done:
        entry(["--version"])
    assert done.value.code == 0
    assert "0." in capsys.readouterr().out  # a version, as setup.cfg's version attr


class HangingExecutor(RawServer):
    """Answers /health and /metrics like an executor, and never answers a submitted task."""

    HEALTH = json.dumps({"status": "ok", "version": "x", "check_s": 0.0, "capabilities": {
        "workspace_mode": "git-clone", "overlay": False, "namespaces": False,
        "egress_guard": False}}).encode()

    def __init__(self) -> None:
        super().__init__(self._answer)

    def _answer(self, conn: socket.socket) -> None:
        data = read_request(conn)
        if data.startswith((b"GET /health", b"GET /metrics")):
            body = self.HEALTH if data.startswith(b"GET /health") else b"# metrics\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            conn.close()
        # a submit: read and hold, as a grading that takes its time


def test_a_second_ctrl_c_exits_130_quietly(demo_task: DemoTask, tmp_path: Path) -> None:
    server = HangingExecutor()
    try:
        files = write(tmp_path / "i.jsonl", [demo_instance(demo_task, f"i{n}") for n in range(2)])
        preds = write(tmp_path / "p.jsonl", [prediction(f"i{n}", "x") for n in range(2)])
        command = [sys.executable, "-m", "sandbox_client", "grade", "--instances", str(files),
                   "--predictions", str(preds), "--urls", server.url,
                   "--output", str(tmp_path / "r.json"), "--timeout", "600"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True) as run:
            assert run.stderr is not None
            from tests.processes import wait_until

            wait_until(lambda: server.connections >= 3)  # /health, /metrics, a submit held
            run.send_signal(signal.SIGINT)
            seen = run.stderr.readline()  # the progress line, once the interrupt unwinds
            run.send_signal(signal.SIGINT)  # while the run still waits for the held task
            rest = run.stderr.read()
            assert run.wait(timeout=60) == 130
        assert "grading 0/2" in seen
        assert "Traceback" not in rest and "abandoned the tasks in flight" in rest
    finally:
        server.close()
