"""SWE-bench file loading and the mapping of an instance to a TaskSpec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_client.cli.swebench import (
    InputError,
    Prediction,
    RepoMapper,
    load_instances,
    load_predictions,
    load_records,
    task_spec,
)

INSTANCE = {
    "instance_id": "django__django-1",
    "repo": "django/django",
    "base_commit": "abc",
    "test_patch": "diff",
    "FAIL_TO_PASS": '["a::b"]',
    "PASS_TO_PASS": "[]",
    "problem_statement": "ignored",
    "setup": "pip install -e .",
}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text",
    [
        json.dumps([{"instance_id": "a"}, {"instance_id": "b"}]),
        '{"instance_id": "a"}\n\n{"instance_id": "b"}\n',
        json.dumps({"a": {"x": 1}, "b": {}}),
    ],
    ids=["json-list", "jsonl", "json-object-by-id"],
)
def test_record_formats(tmp_path: Path, text: str) -> None:
    records = load_records(write(tmp_path / "f.json", text))
    assert [r["instance_id"] for r in records] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{]", "not valid JSON"),
        ('{"instance_id": "a"}\n{oops\n', "line 2 is not valid JSON"),
        ("[1]", "not a JSON object"),
        ('[{"repo": "x"}]', "no instance_id"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_records(write(tmp_path / "f.json", text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_records(tmp_path / "nope.jsonl")


def test_instances_duplicates_and_required_fields(tmp_path: Path) -> None:
    dup = write(tmp_path / "d.json", json.dumps([INSTANCE, INSTANCE]))
    with pytest.raises(InputError, match="appears twice"):
        load_instances(dup)
    bare = write(tmp_path / "b.json", json.dumps([{"instance_id": "x", "repo": "r"}]))
    with pytest.raises(InputError, match="lacks base_commit"):
        load_instances(bare)


def test_predictions_need_instances(tmp_path: Path) -> None:
    instances = {"a": {}}
    orphan = write(tmp_path / "p.jsonl", '{"instance_id": "zzz", "model_patch": "x"}\n')
    with pytest.raises(InputError, match="1 predictions have no instance: zzz"):
        load_predictions(orphan, instances)
    ok = write(tmp_path / "q.jsonl", '{"instance_id": "a", "model_patch": null}\n')
    prediction = load_predictions(ok, instances)["a"]
    assert prediction.is_empty and prediction.model_patch is None


def test_repo_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert RepoMapper()("https://github.com/a/b.git") == "https://github.com/a/b.git"
    assert RepoMapper()("/srv/a") == "/srv/a"
    template = RepoMapper(template="/mirrors/{owner}__{name}")
    assert template("django/django") == "/mirrors/django__django"
    assert RepoMapper(root=tmp_path)("a/b") == str(tmp_path / "a" / "b")
    with pytest.raises(InputError, match="--repo-root"):
        RepoMapper()("django/django", "django__django-1")
    (tmp_path / "local" / "repo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert RepoMapper()("local/repo") == str(tmp_path / "local" / "repo")


def test_task_spec_from_instance() -> None:
    repos = RepoMapper(template="https://github.com/{repo}.git")
    spec = task_spec(INSTANCE, "P", repos, timeout=60)
    assert spec.task_id == "django__django-1"
    assert spec.repo == "https://github.com/django/django.git"
    assert (spec.patch, spec.fail_to_pass, spec.pass_to_pass) == ("P", ["a::b"], [])
    assert (spec.setup, spec.timeout) == (["pip install -e ."], 60)
    own = task_spec({**INSTANCE, "timeout": 5}, None, repos, task_id="x", timeout=60)
    assert (own.task_id, own.patch, own.timeout) == ("x", "", 5)


def test_task_spec_bad_field_names_the_instance() -> None:
    with pytest.raises(InputError, match="django__django-1: log_parser"):
        task_spec({**INSTANCE, "log_parser": "nose"}, "", RepoMapper(root=Path("/")))


def test_prediction_emptiness() -> None:
    assert Prediction("a", "  \n").is_empty and not Prediction("a", "diff").is_empty
