"""Which parts of a repository configure the test run, and keeping them at base_commit.

An agent that cannot fix a bug can still try to make the tests pass: plant a ``conftest.py`` that
marks every test passed, add ``-p no:...`` or ``--deselect`` to ``pytest.ini``, or point
``[tool.pytest.ini_options]`` somewhere else. For the test run these files keep their base_commit
content, whatever the agent did; what the agent changed is reported, not silently dropped.

Whole files: conftest.py anywhere, pytest.ini, pytest.toml (and their dot-named forms),
tox.ini, .coveragerc, and Python start-up hooks (sitecustomize.py, usercustomize.py, *.pth).
Sections: the test-configuring tables of setup.cfg (``[tool:pytest]``, ``[pytest]``,
``[coverage:*]``, ``[tox*]``) and pyproject.toml (``[tool.pytest*]``, ``[tool.coverage*]``,
``[tool.tox*]``); the rest of those files is the agent's to change.
"""

from __future__ import annotations

import configparser
import posixpath
import re

import tomllib

from .diffs import FileDiff

_WHOLE_FILE_NAMES = {
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",  # pytest 9 reads these two first, before pytest.ini
    ".pytest.toml",
    "tox.ini",
    ".coveragerc",
    "sitecustomize.py",
    "usercustomize.py",
    # git applies attributes (working-tree-encoding, eol, filters) as it writes the held-out
    # tests: an agent's .gitattributes could hand the test runner files it cannot read.
    ".gitattributes",
}
SECTIONED_FILES = {"setup.cfg", "pyproject.toml"}

_CFG_SECTION = re.compile(r"^(tool:pytest|pytest|coverage(:.*)?|tox(:.*)?)$")
_TOML_TABLE = re.compile(r"^tool\.(pytest|coverage|tox)(\..*)?$")
MAX_SECTIONED_BYTES = 1024 * 1024
"""An agent's setup.cfg / pyproject.toml over this is not read at all: it goes back to its base
content whole (a real one is a few KiB; parsing 16 MiB of TOML held the GIL for seconds)."""


class _LinearConfigParser(configparser.RawConfigParser):
    """configparser with an option regex that cannot backtrack.

    The standard one, ``(?P<option>.*?)\\s*(?P<vi>=|:)...``, retries its ``\\s*`` at every
    position of the lazy ``.*?``: quadratic in a line of blanks with no delimiter (a 20 KB line
    of an agent's setup.cfg held the GIL for 3.4 s; a 1 MB one, hours). Taking the option
    greedily up to the first delimiter gives the same option once configparser rstrips it (it
    does), in one pass. (Found by a colleague's review of the same issue.)
    """

    OPTCRE = re.compile(r"(?P<option>[^=:]*)(?P<vi>[=:])\s*(?P<value>.*)$")


def is_test_config_file(path: str) -> bool:
    """True for files that the agent patch may not change at all (for the test run)."""
    name = posixpath.basename(path)
    return name in _WHOLE_FILE_NAMES or name.endswith(".pth")


def is_forbidden_path(path: str) -> bool:
    """Paths no patch may write: git's own metadata."""
    return ".git" in path.split("/")


def drop_test_config(sections: list[FileDiff]) -> tuple[list[FileDiff], list[str]]:
    """The file sections of a patch that touch neither test configuration nor a forbidden path,
    and the paths of those that do (sorted, once each): how both a submitted patch and a
    session's captured diff lose what the agent must not change."""
    kept, excluded = [], set()
    for section in sections:
        if any(is_test_config_file(p) or is_forbidden_path(p) for p in section.paths):
            excluded |= section.paths
        else:
            kept.append(section)
    return kept, sorted(excluded)


def _is_test_section(filename: str, header: str) -> bool:
    header = header.strip().strip('"')
    if filename == "setup.cfg":
        return bool(_CFG_SECTION.match(header))
    return bool(_TOML_TABLE.match(header))


def table_header(line: str) -> str | None:
    """The name in an INI section or TOML table header line (``[name]``, ``[[name]]``, spaces
    and a trailing comment allowed), else None.

    Read by hand in one pass: the regex this replaces (``\\s*\\[\\[?\\s*([^\\]]+?)\\s*\\]...``)
    backtracked cubically in the line's length, and one 6 KB line in an agent's pyproject.toml
    held the GIL for 23 s."""
    rest = line.lstrip()
    if not rest.startswith("["):
        return None
    rest = rest[2:] if rest.startswith("[[") else rest[1:]
    close = rest.find("]")
    if close <= 0:
        return None
    name = rest[:close].strip()
    after = rest[close + 1 :]
    after = (after[1:] if after.startswith("]") else after).strip()
    if after and not after.startswith("#"):
        return None
    return name or rest[:close]


def _sections(text: str, filename: str) -> list[tuple[str | None, str]]:
    """Split an INI/TOML file into (header or None, text) blocks at table headers."""
    blocks: list[tuple[str | None, str]] = []
    header: str | None = None
    current: list[str] = []
    for line in re.split(r"(?<=\n)", text):
        name = table_header(line.rstrip("\r\n"))
        if name is not None:
            blocks.append((header, "".join(current)))
            header, current = name, [line]
        else:
            current.append(line)
    blocks.append((header, "".join(current)))
    return [(h, body) for h, body in blocks if h is not None or body]


def _test_view(text: str, filename: str) -> object:
    """What the test runner would read from the file's test-configuring parts; an ``unparsable``
    marker for whatever no parser takes (too big, too deep, bytes it refuses): an agent's file
    that cannot be read is one whose test sections cannot be trusted, never an executor fault."""
    if len(text) > MAX_SECTIONED_BYTES:
        return ("unparsable", "too large", len(text))
    try:
        return _parsed_view(text, filename)
    except (RecursionError, ValueError, UnicodeError, MemoryError):
        # tomllib recurses per nesting level; configparser raises beyond its own Error tree.
        return ("unparsable", text)


def _parsed_view(text: str, filename: str) -> object:
    if filename == "setup.cfg":
        parser = _LinearConfigParser(strict=False, interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            return ("unparsable", text)
        return sorted(
            (name, sorted(parser.items(name)))
            for name in parser.sections()
            if _CFG_SECTION.match(name)
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return ("unparsable", text)
    tool = data.get("tool", {})
    return {key: tool.get(key) for key in ("pytest", "coverage", "tox")}


def restore_test_sections(filename: str, base: str, patched: str) -> tuple[str, bool]:
    """``patched`` with its test-configuring sections put back as in ``base``.

    Returns (text, changed). When a line-level restore cannot make the parsed test configuration
    equal to the base's (dotted keys, inline tables, an unparsable file), the whole file falls back
    to ``base``: correctness of the verdict beats keeping the agent's other edits to this file.
    """
    if len(patched) > MAX_SECTIONED_BYTES:
        return base, True  # not read at all (see MAX_SECTIONED_BYTES)
    if _test_view(patched, filename) == _test_view(base, filename):
        return patched, False
    base_blocks = {h: body for h, body in _sections(base, filename) if h is not None}
    out: list[str] = []
    seen: set[str] = set()
    for header, body in _sections(patched, filename):
        if header is not None and _is_test_section(filename, header):
            seen.add(header)
            if header in base_blocks:
                out.append(base_blocks[header])
            continue
        out.append(body)
    for header, body in base_blocks.items():
        if _is_test_section(filename, header) and header not in seen:
            if out and not out[-1].endswith("\n"):
                out.append("\n")
            out.append(body)
    restored = "".join(out)
    if _test_view(restored, filename) != _test_view(base, filename):
        return base, True
    return restored, True
