"""``--specs FILE``: install and test specs per repository and version, as SWE-bench's harness
keeps them (its ``MAP_REPO_VERSION_TO_SPECS``), so a SWE-bench-format dataset, whose instances
carry no ``setup`` or ``test_command``, is graded without editing it.

The file is one JSON object keyed by ``owner/name`` (``*`` for every repository)::

    {
      "*": {"env": {"PIP_NO_CACHE_DIR": "1"}},
      "pallets/flask": {
        "setup": ["python3 -m venv .venv", ".venv/bin/pip install -q -e . pytest"],
        "test_command": ".venv/bin/python -m pytest -rA {test_files}",
        "versions": {"2.0": {"env": {"PYTHONWARNINGS": "ignore"}}}
      }
    }

Fields: ``setup`` (a command or a list), ``test_command`` (``{test_files}`` becomes the files the
instance's test patch touches, shell-quoted), ``log_parser``, ``env`` (merged), ``timeout``.
An instance's own field wins over its version's, which wins over its repository's, which wins
over ``*``'s; ``env`` entries merge in the same order.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .swebench import InputError

FIELDS = ("setup", "test_command", "log_parser", "env", "timeout")
_TEST_FILE = re.compile(r"^\+\+\+ b/(\S+)$", re.M)


def test_files(test_patch: str) -> list[str]:
    """The files a test patch leaves in place, in order (deleted files have no ``+++ b/``)."""
    return list(dict.fromkeys(_TEST_FILE.findall(test_patch or "")))


@dataclass(frozen=True)
class RepoSpecs:
    """Specs by repository (and ``versions`` within one); empty when no ``--specs`` was given."""

    by_repo: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None) -> RepoSpecs:
        if path is None:
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not a readable JSON specs file ({exc})") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: specs must be a JSON object keyed by owner/name")
        for repo, spec in data.items():
            _check(path, repo, spec, allow_versions=True)
            for version, entry in (spec.get("versions") or {}).items():
                _check(path, f"{repo} version {version}", entry, allow_versions=False)
        return cls(data)

    def fill(self, instance: Mapping[str, Any]) -> dict[str, Any]:
        """``instance`` with the fields it lacks taken from its version's, its repository's and
        ``*``'s specs, ``{test_files}`` filled in."""
        repo_spec = self.by_repo.get(str(instance.get("repo", "")), {})
        version = repo_spec.get("versions", {}).get(str(instance.get("version", "")), {})
        layers = [self.by_repo.get("*", {}), repo_spec, version, instance]
        merged: dict[str, Any] = dict(instance)
        for name in FIELDS:
            if name == "env":
                env = {k: v for layer in layers for k, v in (layer.get("env") or {}).items()}
                if env:
                    merged["env"] = env
                continue
            for layer in reversed(layers):
                if layer.get(name):
                    merged[name] = layer[name]
                    break
        command = merged.get("test_command")
        if isinstance(command, str) and "{test_files}" in command:
            files = " ".join(map(shlex.quote, test_files(str(instance.get("test_patch") or ""))))
            merged["test_command"] = command.replace("{test_files}", files)
        return merged


def _check(path: Path, where: str, spec: Any, *, allow_versions: bool) -> None:
    if not isinstance(spec, dict):
        raise InputError(f"{path}: {where}: a spec must be a JSON object")
    allowed = set(FIELDS) | ({"versions"} if allow_versions else set())
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise InputError(
            f"{path}: {where}: unknown field {', '.join(unknown)} "
            f"(known: {', '.join(sorted(allowed))})"
        )
    setup = spec.get("setup")
    commands = [setup] if isinstance(setup, str) else setup
    if setup is not None and not (
        isinstance(commands, list) and all(isinstance(c, str) for c in commands)
    ):
        raise InputError(f"{path}: {where}: setup must be a command or a list of commands")
    for name in ("test_command", "log_parser"):
        if spec.get(name) is not None and not isinstance(spec[name], str):
            raise InputError(f"{path}: {where}: {name} must be a string")
    env = spec.get("env")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
    ):
        raise InputError(f"{path}: {where}: env must map names to strings")
    if "versions" in spec and not isinstance(spec["versions"], dict):
        raise InputError(f"{path}: {where}: versions must map a version to a spec")
