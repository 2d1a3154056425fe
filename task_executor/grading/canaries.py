"""Canary tests: tests the executor plants per grading, whose outcome it knows in advance.

Code the tests import runs inside the test process and can rewrite the runner so that every
witness (the reporter, the summary line, the exit status) agrees on forged passes. Canaries make
that forgery detectable: beside the FAIL_TO_PASS tests, in the same files (as methods of the same
class when those tests are methods), the executor plants a few tests with secret names drawn per
grading, some written to fail and some to pass. A forger that cannot tell them from the task's
tests flips the failing canaries too, or drops them; a run whose canaries do not come out as
planted was tampered with (``check``). Their names never reach the result (``scrub``).

Where they go (``Plan.place``, ``canary_places``): at random test boundaries of the
FAIL_TO_PASS tests' scope, with clones of those tests (under fresh names, calling the package as
they do) among them, made to fail: a package whose results equal anything passes the clones.
The executor places them once the test patch is applied (``planting``).

What the plan needs from the test command: that it runs them. The default command runs whole
test files; a simple pytest, unittest or Django command naming test ids gets the canaries' ids
appended; anything else (shell pipelines, selection options, discovery) gets no canaries, and the
result says why (``Plan.skipped``).
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from . import canary_log, canary_places

MAX_FILES = 2
"""Files that get canaries (each gets ``FAILING + PASSING``): a few functions, microseconds."""
FAILING, PASSING = 2, 1
CLONES_PER_FILE = 2
"""Clones of FAIL_TO_PASS tests per file (each runs that test's body up to its comparison)."""

# Common words of test names, mixed with the neighbours' own so that a name is not guessable from
# the file alone.
_WORDS = (
    "value values result results default defaults empty single multiple order ordering nested "
    "invalid valid missing none basic simple returns raises handles keeps accepts rejects "
    "updates reads writes parse format convert merge split join copy repr str equal equality "
    "compare length size count index key keys items state config option options context cache "
    "limit range bounds zero negative positive large small unicode bytes path paths name names "
    "type types error errors warning output input call calls args kwargs"
).split()
_SHELL = re.compile(r"[;&|<>`$()\n]")
# pytest options that narrow what runs, or stop early: canaries could be left out or stop the run.
_NARROWING = {"-k", "-m", "-x", "--exitfirst", "--lf", "--last-failed", "--ff", "--sw",
              "--stepwise", "--co", "--collect-only", "--deselect", "--maxfail", "--pdb",
              "--failed-first", "--sw-skip", "--stepwise-skip"}
# pytest options whose value is the next word (so it is not a path).
_VALUED = {"-p", "-o", "-c", "-W", "-r", "--tb", "--rootdir", "--confcutdir", "--basetemp",
           "--durations", "--ignore", "--ignore-glob", "--import-mode", "-n", "--log-level",
           "--junitxml", "--junit-xml", "--override-ini", "--capture", "--color", "--deselect",
           "-k", "-m", "--maxfail", "--timeout"}


@dataclass(frozen=True)
class Canary:
    """One planted test: where, its secret name, and how it must come out."""

    path: str
    """The repository-relative file it is planted in (one the test patch writes)."""
    owner: str
    """The dotted class path it is a method of, or "" for a module-level function."""
    name: str
    fails: bool
    label: str
    """How the test command names it: a pytest node id, or a unittest/Django label."""
    original: str = ""
    """For a clone, the name of the task's test it was cloned from ("" for the others)."""


@dataclass(frozen=True)
class _Scope:
    """Where a file's canaries go: the FAIL_TO_PASS tests' class (or module) and names."""

    owner: str
    targets: tuple[str, ...]
    prefix: str
    vocabulary: tuple[str, ...]
    unittest_style: bool
    module: str


@dataclass
class Plan:
    """The canaries of one grading and the test command that runs them (or why there are none)."""

    command: str
    canaries: list[Canary] = field(default_factory=list)
    skipped: str | None = None
    planted: bool = False
    """Whether the canaries are in the tree (set once ``planting`` has put them there)."""
    clean: bool = False
    """Whether they came out as planted (set once the run was checked)."""
    scopes: dict[str, _Scope] = field(default_factory=dict)
    extension: _Extension | None = None
    taken: set[str] = field(default_factory=set)
    required: list[str] = field(default_factory=list)
    """The task's FAIL_TO_PASS and PASS_TO_PASS tests (``code_check`` holds them)."""
    code_files: dict[str, str] = field(default_factory=dict)
    """The test files whose code the reporter checks, with their SHA-256 (``planting``)."""
    reported: tuple[int, int] = (0, 0)
    """(failed, passed) canary tests the run reported (a parametrised clone is several)."""

    def paths(self) -> list[str]:
        """The files that get canaries."""
        return sorted({c.path for c in self.canaries} | set(self.scopes))

    def place(self, path: str, source: str) -> str:
        """``source`` (the file as the test patch left it) with its canaries: placed among the
        tests with clones of the FAIL_TO_PASS tests (which join ``canaries``), or, when the
        file cannot be read so, appended (no clones)."""
        mine = [c for c in self.canaries if c.path == path]
        scope = self.scopes.get(path)
        placed = None
        if scope is not None:
            self.taken.update(re.findall(r"\bdef\s+(\w+)", source))
            placed = canary_places.place(
                source, scope.owner, [_code(c) for c in mine], list(scope.targets),
                CLONES_PER_FILE,
                lambda: _fresh_name(scope.prefix, list(scope.vocabulary), self.taken))
        if placed is None:
            return source + "".join(_source(c) for c in mine)
        for name in placed.clones:
            self.canaries.append(Canary(path=path, owner=scope.owner, name=name, fails=True,
                                        label=_label(path, scope, name),
                                        original=placed.originals[name]))
        if self.extension is not None:
            self.command = self.extension.extend(self.canaries)
        return placed.text

    def scrub(self, text: str | None) -> str | None:
        """``text`` as the agent may see it: nothing that names a canary (``canary_log``), and,
        once the canaries came out as planted (``clean``), summary counts without them."""
        if not text or not self.canaries:
            return text
        counts = self.reported if self.clean else None
        return canary_log.scrub(text, [c.name for c in self.canaries], counts)

    def mask(self, text: str | None) -> str | None:
        """``text`` with every canary's name replaced (for one-line messages)."""
        for canary in self.canaries:
            text = text.replace(canary.name, "<canary>") if text else text
        return text

    def is_canary(self, test_id: str) -> bool:
        return any(_names(test_id, c.name) for c in self.canaries)


def _original_id(test_id: str, clone: Canary) -> str:
    """The id the clone's original has in the same report (its parameters kept)."""
    bare, bracket, parameters = test_id.partition("[")
    return bare[: len(bare) - len(clone.name)] + clone.original + bracket + parameters


def _names(test_id: str, name: str) -> bool:
    """Whether a reported id names the canary ``name`` (pytest ``::``, unittest ``.``)."""
    bare = test_id.split("[", 1)[0]
    return bare.endswith((f"::{name}", f".{name}")) or bare == name


def _code(canary: Canary) -> str:
    """The canary's code: a comparison that fails or holds, written as the task's tests are,
    without ``assert`` (``python -O`` would strip it and pass every failing canary)."""
    items = [secrets.randbelow(90) + 10 for _ in range(3)]
    expected = min(items) + (secrets.randbelow(7) + 1 if canary.fails else 0)
    this = "self" if canary.owner else ""
    lines = [
        f"def {canary.name}({this}):",
        f"    items = {items!r}",
        f"    if sorted(items)[0] != {expected}:",
        f"        raise AssertionError(\"unexpected {canary.name.split('_')[-1]}\")",
    ]
    return "\n".join(lines) + "\n"


def _source(canary: Canary) -> str:
    """The canary appended at the end of its file (when the file cannot be parsed)."""
    text = "\n\n\n" + _code(canary)
    if canary.owner:
        # A method of the class the FAIL_TO_PASS tests are methods of, set after its definition.
        text += (f"\n\n{canary.owner}.{canary.name} = {canary.name}\n"
                 f"{canary.owner}.{canary.name}.__qualname__ = "
                 f"\"{canary.owner}.{canary.name}\"\n"
                 f"del {canary.name}\n")
    return text


@dataclass(frozen=True)
class _Anchor:
    """Where a FAIL_TO_PASS test lives: its file (as named in its id), class path and name."""

    file: str
    owner: str
    name: str
    module: str = ""
    """unittest/Django: the dotted module of its label."""


_UNITTEST_NAME = re.compile(r"^(?P<method>\w+) \((?P<rest>[\w.]+)\)$")


def _pytest_anchor(test_id: str) -> _Anchor | None:
    parts = test_id.split("[", 1)[0].split("::")
    if len(parts) < 2 or not parts[0].endswith(".py"):
        return None
    if not all(p.isidentifier() for p in parts[1:]):
        return None
    return _Anchor(file=parts[0], owner=".".join(parts[1:-1]), name=parts[-1])


def _unittest_anchor(test_id: str) -> _Anchor | None:
    match = _UNITTEST_NAME.match(test_id)
    if match:
        method, rest = match.group("method"), match.group("rest")
        dotted = rest[: -len(method) - 1] if rest.endswith(f".{method}") else rest
    else:
        method, _, dotted = test_id.rpartition(".")[2], "", test_id.rpartition(".")[0]
    module, _, owner = dotted.rpartition(".")
    if not module or not owner or not method.isidentifier():
        return None
    return _Anchor(file=module.replace(".", "/") + ".py", owner=owner, name=method,
                   module=module)


def anchor_of(test_id: str, parser: str) -> _Anchor | None:
    """Where the test ``test_id`` lives (file, class path, name), as ids of ``parser`` say."""
    return (_pytest_anchor if parser == "pytest" else _unittest_anchor)(test_id)


def _planted_path(anchor: _Anchor, test_files: list[str]) -> str | None:
    """The test patch's file the anchor's id names (ids may be relative to a subdirectory)."""
    for path in test_files:
        if path == anchor.file or path.endswith("/" + anchor.file):
            return path
    return None


def _words(names: list[str], prefix: str) -> list[str]:
    found = {w for n in names for w in n.split("[", 1)[0].lower().split("_")
             if w.isalpha() and len(w) > 2 and w != prefix}
    return sorted(found | set(_WORDS))


def _fresh_name(prefix: str, vocabulary: list[str], taken: set[str]) -> str:
    while True:
        count = 2 + secrets.randbelow(2)
        name = "_".join([prefix, *(secrets.choice(vocabulary) for _ in range(count))])
        if name not in taken:
            taken.add(name)
            return name


def plan(test_files: list[str], fail_to_pass: list[str], pass_to_pass: list[str],
         command: str, parser: str, default_command: bool) -> Plan:
    """The canaries of one grading: beside the FAIL_TO_PASS tests in the test patch's files."""
    unittest_style = parser != "pytest"
    anchors: dict[str, _Anchor] = {}
    for test_id in fail_to_pass:
        anchor = anchor_of(test_id, parser)
        if anchor is None or (unittest_style and not anchor.owner):
            continue
        path = _planted_path(anchor, test_files)
        if path is not None and path not in anchors and len(anchors) < MAX_FILES:
            anchors[path] = anchor
    required = [*fail_to_pass, *pass_to_pass]
    if not anchors:
        return Plan(command, skipped="no FAIL_TO_PASS test is a Python test in a file the "
                    "test patch writes", required=required)
    extended = _command_for(command, parser, default_command)
    if isinstance(extended, _Refusal):
        return Plan(command, skipped=extended.reason, required=required)
    names = [t.split("::")[-1] if "::" in t else t for t in [*fail_to_pass, *pass_to_pass]]
    taken = {n.split("[", 1)[0].split(" ", 1)[0].rsplit(".", 1)[-1] for n in names}
    result = Plan(command, taken=taken, extension=extended, required=required)
    for path, anchor in anchors.items():
        prefix = anchor.name.split("_", 1)[0] if "_" in anchor.name else "test"
        vocabulary = _words(names, prefix)
        # The FAIL_TO_PASS tests of this file in the anchor's scope: the ones to clone.
        targets = [a.name for a in (anchor_of(t, parser) for t in fail_to_pass) if a is not None
                   and a.owner == anchor.owner and _planted_path(a, [path]) == path]
        scope = _Scope(anchor.owner, tuple(dict.fromkeys(targets)), prefix, tuple(vocabulary),
                       unittest_style, anchor.module)
        result.scopes[path] = scope
        kinds = [True] * FAILING + [False] * PASSING
        for fails in sorted(kinds, key=lambda _: secrets.randbits(8)):
            name = _fresh_name(prefix, vocabulary, taken)
            result.canaries.append(Canary(path=path, owner=anchor.owner, name=name, fails=fails,
                                          label=_label(path, scope, name)))
    result.command = extended.extend(result.canaries)
    return result


def _label(path: str, scope: _Scope, name: str) -> str:
    """How the test command names a canary: a unittest/Django label or a pytest node id."""
    if scope.unittest_style:
        return f"{scope.module}.{scope.owner}.{name}"
    owners = scope.owner.split(".") if scope.owner else []
    return "::".join([path, *owners, name])


@dataclass(frozen=True)
class _Refusal:
    reason: str


@dataclass(frozen=True)
class _Extension:
    """How to make a command run the canaries: as is, or with their labels appended."""

    command: str
    append: bool
    covered: tuple[str, ...] = ()
    """What the command runs whole: paths (a file, a directory holding it), dotted labels."""

    def runs_whole(self, canary: Canary) -> bool:
        path, label = canary.path, canary.label
        return any(path == p or path.startswith(p + "/") or p in (".", "")
                   or label.startswith(p + ".") for p in self.covered)

    def extend(self, canaries: list[Canary]) -> str:
        if not self.append:
            return self.command
        labels = [c.label for c in canaries if not self.runs_whole(c)]
        return " ".join([self.command, *map(shlex.quote, labels)])


def _command_for(command: str, parser: str, default_command: bool) -> _Extension | _Refusal:
    """Whether (and how) ``command`` can run canaries; it is run by bash, so only a simple
    command (one program, words only) is understood well enough to extend."""
    if default_command:
        return _Extension(command, append=False)  # pytest over whole files, canaries included
    if _SHELL.search(command):
        return _Refusal("custom test command is not a simple command (shell syntax)")
    try:
        words = shlex.split(command)
    except ValueError:
        return _Refusal("custom test command cannot be split into words")
    if parser == "pytest":
        return _pytest_command(command, words)
    return _unittest_command(command, words)


def _pytest_command(command: str, words: list[str]) -> _Extension | _Refusal:
    runner = next((i for i, w in enumerate(words)
                   if PurePosixPath(w).name in ("pytest", "py.test")), None)
    if runner is None:
        return _Refusal("custom test command does not run pytest")
    args, positional, skip = words[runner + 1 :], [], False
    for word in args:
        if skip:
            skip = False
            continue
        option = word.split("=", 1)[0]
        if option in _NARROWING or word.startswith("--maxfail"):
            return _Refusal(f"custom test command selects or stops early ({option})")
        if option in _VALUED and "=" not in word:
            skip = True
        elif not word.startswith("-"):
            positional.append(word)
    if not positional:
        return _Refusal("custom test command names no test files or ids")
    whole = tuple(p.rstrip("/") for p in positional if "::" not in p)
    return _Extension(command, append=True, covered=whole)


def _unittest_command(command: str, words: list[str]) -> _Extension | _Refusal:
    runner = next((i for i, w in enumerate(words)
                   if w == "unittest" or PurePosixPath(w).name == "runtests.py"), None)
    if runner is None:
        return _Refusal("custom test command runs neither unittest nor Django's runtests.py")
    labels = [w for w in words[runner + 1 :] if not w.startswith("-")]
    if not labels or "discover" in labels:
        return _Refusal("custom test command discovers its tests (no labels to add to)")
    if any(w in ("-k", "-f", "--failfast", "-p", "--pattern") for w in words[runner + 1 :]):
        return _Refusal("custom test command selects or stops early")
    return _Extension(command, append=True, covered=tuple(labels))


def check(plan_: Plan, states: dict[str, str]) -> str | None:
    """Why the run's canaries did not come out as planted (tampering), or None if they did.

    The message says which canary by its place, not its name (the result reaches the agent)."""
    failed = passed = 0
    for index, canary in enumerate(plan_.canaries):
        mine = {test_id: state for test_id, state in states.items()
                if _names(test_id, canary.name)}
        seen = list(mine.values())
        where = f"canary {index + 1} in {canary.path}" + (
            f" (class {canary.owner})" if canary.owner else "")
        if not seen:
            return f"{where}, planted to {'fail' if canary.fails else 'pass'}, was not reported"
        # A clone that passed where its original failed in this run: the code returned the
        # decoy's value honestly (wrong code can; a forgery that makes results equal anything
        # passes the original too). Counted as passed, never as tampering.
        wrong = [state for test_id, state in mine.items()
                 if (state not in ("FAILED", "ERROR") if canary.fails else state != "PASSED")
                 and not (canary.original and state == "PASSED"
                          and states.get(_original_id(test_id, canary)) in ("FAILED", "ERROR"))]
        if wrong:
            return (f"{where}, planted to {'fail' if canary.fails else 'pass'}, was reported "
                    f"{wrong[0]}")
        failed += sum(s == "FAILED" for s in seen)
        passed += sum(s == "PASSED" for s in seen)
    plan_.reported = (failed, passed)
    return None
