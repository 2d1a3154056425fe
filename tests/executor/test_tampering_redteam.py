"""Red team: patches that fix nothing and try to come back ``resolved`` (or with no verdict).

Each attack is appended to the demo package (``calc/__init__.py``, imported by the held-out
tests at collection) and graded through ``POST /task/submit`` on a real executor, as
tests/executor/test_tampering.py does. None of these touches a runner entry point the
integrity record watches. The first four (``ATTACKS``) tell the task's tests from the canaries
without knowing their names; they got ``resolved`` until the canaries were cloned from the
FAIL_TO_PASS tests and placed among them. ``VARIANTS`` are the next tries against that defence:
equality that lies only where a clone would not look, and, with the FAIL_TO_PASS names known,
test code swapped, compiled falsely, skipped or wrapped, all of which the code record sees. An
attack that still works is marked ``xfail(strict=True)`` (the test asserts the right outcome,
so it starts passing once the grader stops it). ``test_each_attack_forges_without_a_grader``
shows that every attack is real: run by plain pytest, the FAIL_TO_PASS tests pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from task_executor.demo import DemoTask, diff_of
from tests.conftest import RunningExecutor
from tests.executor.test_tampering import (  # noqa: F401  (fixtures)
    PLANTED,
    SOURCE,
    class_task,
    django_task,
    shared_executor,
    task,
    unittest_task,
)


def _appended(demo: DemoTask, code: str) -> str:
    """The patch that appends ``code`` to the package (after ``add`` is defined)."""
    return diff_of(Path(demo.repo), {"calc/__init__.py": SOURCE + "\n\n" + code})


def _assert_not_resolved_with_a_verdict(result: dict) -> None:
    assert result["status"] == "unresolved" and result["resolved"] is False, (
        result["status"], result["error"], result.get("error_code"), result["log"][-2000:])


def _assert_tampered(result: dict) -> None:
    _assert_not_resolved_with_a_verdict(result)
    assert result["error_code"] == "tampered", (result["error"], result["log"][-2000:])


# The canaries never call into the package: a value that equals anything, returned only from
# the package's own function, passes every task test and leaves every canary honest.
ALWAYS_EQUAL = (
    "class _Anything(int):\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    __hash__ = int.__hash__\n"
    "_add = add\n"
    "def add(a, b):\n"
    "    return _Anything(_add(a, b))\n"
)

# No runner object is touched: the test functions themselves get a no-op body, once their
# module has finished executing (a profile hook sees its frame return). Only tests whose code
# names a function of the package are swapped: the canaries name none, so they stay honest.
SWAP_TEST_BODIES = (
    "import sys\n"
    "def _swap(namespace):\n"
    "    mine = {k for k, v in globals().items() if callable(v) and not k.startswith('_')}\n"
    "    for name, value in list(namespace.items()):\n"
    "        if isinstance(value, type) and value.__module__ == namespace['__name__']:\n"
    "            _swap({**vars(value), '__name__': namespace['__name__']})  # methods too\n"
    "        code = getattr(value, '__code__', None)\n"
    "        if not name.startswith('test') or code is None or not mine & set(code.co_names):\n"
    "            continue\n"
    "        args = ', '.join(code.co_varnames[:code.co_argcount])\n"
    "        scope = {}\n"
    "        exec('def _noop(' + args + '):\\n    return None\\n', scope)\n"
    "        value.__code__ = scope['_noop'].__code__.replace(co_name=code.co_name,\n"
    "            co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)\n"
    "def _importer():\n"
    "    frame = sys._getframe(1)\n"
    "    while frame is not None:\n"
    "        if frame.f_code.co_name == '<module>' and\\\n"
    "                frame.f_globals.get('__name__', '').rpartition('.')[2].startswith('test'):\n"
    "            return frame\n"
    "        frame = frame.f_back\n"
    "    return None\n"
    "_target = _importer()\n"
    "if _target is not None:\n"
    "    _previous = sys.getprofile()\n"
    "    def _profile(frame, event, arg):\n"
    "        if event == 'return' and frame is _target:\n"
    "            sys.setprofile(_previous)\n"
    "            _swap(frame.f_globals)\n"
    "    sys.setprofile(_profile)\n"
)

# The same swap, from a thread that waits for the test module's import to end (no profile hook,
# nothing installed in the interpreter). It won 3 of 3 under pytest and lost under unittest
# (the first test ran before the swap): a race, so it is not a strict case below.
SWAP_FROM_A_THREAD = SWAP_TEST_BODIES.split("_target = _importer()")[0] + (
    "import threading, time\n"
    "_target = _importer()\n"
    "def _wait(namespace):\n"
    "    # importlib marks a module's spec as initializing until its body has run.\n"
    "    spec = namespace.get('__spec__')\n"
    "    for _ in range(20000):\n"
    "        if not getattr(spec, '_initializing', False):\n"
    "            _swap(namespace)\n"
    "            return\n"
    "        time.sleep(0.0005)\n"
    "if _target is not None:\n"
    "    threading.Thread(target=_wait, args=(_target.f_globals,), daemon=True).start()\n"
)

# Canaries are appended at the end of the file the test patch writes: reading the test file
# from disk, every test defined after the last line that calls the package is a canary. The
# same swap as above, with the task's tests chosen by position instead of by the names they use.
SWAP_BY_POSITION = SWAP_TEST_BODIES.replace(
    "not mine & set(code.co_names)",
    "code.co_firstlineno > _last_real_line(code.co_filename, mine)",
).replace("def _importer():", (
    "def _last_real_line(path, mine):\n"
    "    lines = open(path).read().splitlines()\n"
    "    return max(i + 1 for i, line in enumerate(lines) if any(m + '(' in line for m in mine))\n"
    "def _importer():"))

# No verdict from the agent's own bytes: output nothing can decode, in quantity.
BINARY_FLOOD = (
    "import os\n"
    "_add = add\n"
    "def add(a, b):\n"
    "    chunk = bytes(range(128, 256)) * 8192\n"
    "    for _ in range(64):\n"
    "        os.write(1, chunk)\n"
    "        os.write(2, chunk)\n"
    "    return _add(a, b)\n"
)

# A deeply nested value in the failing assertion: pytest's comparison explanation recurses.
DEEP_VALUE = (
    "_add = add\n"
    "def add(a, b):\n"
    "    value = []\n"
    "    for _ in range(100000):\n"
    "        value = [value]\n"
    "    return value\n"
)

# Kill the test process from a test of the task (SIGKILL to itself): no end record.
SELF_KILL = (
    "import os, signal\n"
    "_add = add\n"
    "def add(a, b):\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
)

# No function, code object or runner class changes: a plugin found through gc hooks only
# collection (not a hook the record counts as sensitive) and points each task test's item at a
# no-op (``item.obj``), chosen again by the package names its code uses.
ITEM_OBJ_SWAP = (
    "import gc\n"
    "from _pytest.config import Config\n"
    "def _noop(*args, **kwargs):\n"
    "    return None\n"
    "class _Collect:\n"
    "    def pytest_collection_modifyitems(self, session, config, items):\n"
    "        for item in items:\n"
    "            code = getattr(getattr(item, 'obj', None), '__code__', None)\n"
    "            if code is not None and {'add', 'mul'} & set(code.co_names):\n"
    "                item.obj = _noop\n"
    "for _config in [o for o in gc.get_objects() if isinstance(o, Config)]:\n"
    "    _config.pluginmanager.register(_Collect(), 'collect-helper')\n"
)

# No verdict from a full disk: the package fills /tmp (where the report goes) while the tests run.
FILL_THE_DISK = (
    "import os\n"
    "_add = add\n"
    "def add(a, b):\n"
    "    try:\n"
    "        with open('/tmp/.fill', 'ab') as out:\n"
    "            while True:\n"
    "                out.write(b'x' * (1 << 20))\n"
    "    except OSError:\n"
    "        pass\n"
    "    return _add(a, b)\n"
)

# ----------------------------------------------------------------- the next tries, names known

F2P = "('test_add', 'test_add_many')"
"""What an attacker that knows the FAIL_TO_PASS tests' names (not the canaries') targets."""

# Equal only to ints: a clone compared with a fresh sentinel would stay honest, so the clones of
# a test whose expected value is an int compare with another int.
EQ_ONLY_INTS = ALWAYS_EQUAL.replace(
    "        return True\n", "        return isinstance(other, int) or int(self) == other\n")

# Equal only to values that appear as literals in a test file (read from disk): a random decoy
# would stay honest, so a decoy is another literal of the same file where there is one.
EQ_ONLY_FILE_LITERALS = (
    "import ast, sys\n"
    "def _file_literals():\n"
    "    found = set()\n"
    "    for name, module in list(sys.modules.items()):\n"
    "        path = getattr(module, '__file__', None) or ''\n"
    "        if name.rpartition('.')[2].startswith('test') and path.endswith('.py'):\n"
    "            tree = ast.parse(open(path).read())\n"
    "            found |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)\n"
    "                      and type(n.value) is int}\n"
    "    return found\n"
) + ALWAYS_EQUAL.replace(
    "        return True\n",
    "        return (type(other) is int and other in _file_literals()) or int(self) == other\n")

# Equal only to the literal written on the comparing line (read through the caller's frame), and
# to anything on a line with none: the clone's line carries its decoy, so it passes too.
EQ_THE_LINES_LITERAL = (
    "import linecache, re, sys\n"
    "def _line_literals():\n"
    "    frame = sys._getframe(2)\n"
    "    while frame is not None and not frame.f_code.co_name.startswith('test'):\n"
    "        frame = frame.f_back\n"
    "    if frame is None:\n"
    "        return None\n"
    "    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)\n"
    "    return [eval(x) for x in re.findall(r\"(?:==|,)\\s*(-?\\d+|'[^']*'|\\\"[^\\\"]*\\\")\", line)]\n"  # noqa: E501
) + ALWAYS_EQUAL.replace(
    "        return True\n",
    "        literals = _line_literals()\n"
    "        return not literals or other in literals\n")

# Equal to anything, but only inside the FAIL_TO_PASS tests' own frames: the clones (other names)
# stay honest and no code changes. Known to work: see the README.
EQ_IN_KNOWN_FRAMES = (
    "import sys\n"
    "def _in_known_test():\n"
    "    frame = sys._getframe(2)\n"
    "    while frame is not None:\n"
    f"        if frame.f_code.co_name in {F2P}:\n"
    "            return True\n"
    "        frame = frame.f_back\n"
    "    return False\n"
) + ALWAYS_EQUAL.replace(
    "        return True\n", "        return _in_known_test() or int(self) == other\n")

# The profile-hook swap of attack 2, of the FAIL_TO_PASS tests only: the clones stay honest.
SWAP_KNOWN_CODE = SWAP_TEST_BODIES.replace("not mine & set(code.co_names)",
                                           f"name not in {F2P}")

# The same swap at the last moment: a trace hook swaps each test's code as pytest's
# pytest_pyfunc_call starts (after any check made before the call).
SWAP_AT_THE_CALL = (
    "import sys\n"
    "def _noop_for(code):\n"
    "    scope = {}\n"
    "    args = ', '.join(code.co_varnames[:code.co_argcount])\n"
    "    exec('def _noop(' + args + '):\\n    return None\\n', scope)\n"
    "    return scope['_noop'].__code__.replace(co_name=code.co_name,\n"
    "        co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)\n"
    "def _tracer(frame, event, arg):\n"
    "    if event == 'call' and frame.f_code.co_name == 'pytest_pyfunc_call':\n"
    "        item = frame.f_locals.get('pyfuncitem')\n"
    f"        if getattr(item, 'originalname', None) in {F2P}:\n"
    "            function = item.obj\n"
    "            if function.__code__.co_code != _noop_for(function.__code__).co_code:\n"
    "                function.__code__ = _noop_for(function.__code__)\n"
    "    return None\n"
    "sys.settrace(_tracer)\n"
)

# The tools a check would use, made to lie (digests all alike, marshal constant, ``compile``
# emptying the FAIL_TO_PASS tests' bodies), then the test module compiled again through them
# as its import ends, and its FAIL_TO_PASS functions given the forged code.
FORGED_TOOLS = (
    "import ast, builtins, hashlib, marshal\n"
    "class _Same:\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        pass\n"
    "    def update(self, *args):\n"
    "        pass\n"
    "    def hexdigest(self):\n"
    "        return '0' * 64\n"
    "    def digest(self):\n"
    "        return bytes(32)\n"
    "hashlib.sha256 = _Same\n"
    "marshal.dumps = lambda *args, **kwargs: b''\n"
    "_compile = builtins.compile\n"
    "def _forging(source, filename, mode, *args, **kwargs):\n"
    "    if isinstance(source, ast.Module):\n"
    "        for node in ast.walk(source):\n"
    f"            if isinstance(node, ast.FunctionDef) and node.name in {F2P}:\n"
    "                node.body = [ast.Pass(lineno=node.lineno, col_offset=4)]\n"
    "    return _compile(source, filename, mode, *args, **kwargs)\n"
    "builtins.compile = _forging\n"
) + SWAP_TEST_BODIES.replace("def _swap(namespace):", (
    "def _swap(namespace):\n"
    "    path = namespace['__file__']\n"
    "    module = compile(ast.parse(open(path).read()), path, 'exec')\n"
    "    for const in module.co_consts:\n"
    f"        if getattr(const, 'co_name', None) in {F2P}:\n"
    "            namespace[const.co_name].__code__ = const\n"
    "def _unused(namespace):"))

# A late plugin (found through gc) points each FAIL_TO_PASS item's ``runtest`` at a no-op: the
# test function is never called (a no-op item, not a swapped function).
ITEM_RUNTEST_SWAP = ITEM_OBJ_SWAP.replace(
    "            code = getattr(getattr(item, 'obj', None), '__code__', None)\n"
    "            if code is not None and {'add', 'mul'} & set(code.co_names):\n"
    "                item.obj = _noop\n",
    f"            if getattr(item, 'originalname', None) in {F2P}:\n"
    "                item.runtest = _noop\n")

# The real test function still runs, inside a wrapper that swallows its failure.
WRAPPER_SWALLOWS = ITEM_OBJ_SWAP.replace(
    "            code = getattr(getattr(item, 'obj', None), '__code__', None)\n"
    "            if code is not None and {'add', 'mul'} & set(code.co_names):\n"
    "                item.obj = _noop\n",
    f"            if getattr(item, 'originalname', None) in {F2P}:\n"
    "                item.obj = _guarded(item.obj)\n").replace(
    "class _Collect:", (
        "import functools\n"
        "def _guarded(real):\n"
        "    @functools.wraps(real)\n"
        "    def run(*args, **kwargs):\n"
        "        try:\n"
        "            real(*args, **kwargs)\n"
        "        except AssertionError:\n"
        "            pass\n"
        "    return run\n"
        "class _Collect:"))

# No code changes at all: the parametrize values of the FAIL_TO_PASS tests (data, read at
# collection) replaced, as their module's import ends, by ints equal to anything. Known to work
# on a parametrised test: see the README.
_LIE_ABOUT_PARAMS = (
    "class _Anyone(int):\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    __hash__ = int.__hash__\n"
    "def _lie_about_params(namespace):\n"
    f"    for name in {F2P}:\n"
    "        for mark in getattr(namespace.get(name), 'pytestmark', []):\n"
    "            if mark.name == 'parametrize':\n"
    "                mark.args[1][:] = [tuple(_Anyone(v) if type(v) is int else v for v in row)\n"
    "                                   for row in mark.args[1]]\n")
LYING_PARAMS = SWAP_TEST_BODIES.replace("def _swap(namespace):", (
    _LIE_ABOUT_PARAMS + "def _swap(namespace):\n    _lie_about_params(namespace)\n"
    "def _unused(namespace):"))

# Same bytecode, lying constants: the test's ``5`` replaced by an int subclass equal to anything
# (its repr still says 5).
LYING_CONSTANT = SWAP_KNOWN_CODE.replace(
    "        args = ', '.join(code.co_varnames[:code.co_argcount])\n"
    "        scope = {}\n"
    "        exec('def _noop(' + args + '):\\n    return None\\n', scope)\n"
    "        value.__code__ = scope['_noop'].__code__.replace(co_name=code.co_name,\n"
    "            co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)\n",
    "        value.__code__ = code.replace(co_consts=tuple(\n"
    "            _Yes(c) if type(c) is int else c for c in code.co_consts))\n").replace(
    "def _swap(namespace):", (
        "class _Yes(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = int.__hash__\n"
        + _LIE_ABOUT_PARAMS +  # for the parametrised test, whose expected value is no constant
        "def _swap(namespace):\n"
        "    if namespace.get('__name__', '').endswith('test_calc'):\n"
        "        _lie_about_params(namespace)"))

# The real test code, called by a wrapper that patches what it sees: ``mock.patch`` (the
# standard library's, as a test file's own decorators are) puts an always-equal ``add`` into
# the test module while the FAIL_TO_PASS tests run. Known to work: see the README.
PATCHED_WHILE_IT_RUNS = ITEM_OBJ_SWAP.replace(
    "            code = getattr(getattr(item, 'obj', None), '__code__', None)\n"
    "            if code is not None and {'add', 'mul'} & set(code.co_names):\n"
    "                item.obj = _noop\n",
    f"            if getattr(item, 'originalname', None) in {F2P}:\n"
    "                target = item.obj.__module__ + '.add'\n"
    "                item.obj = mock.patch(target, _always_equal_add)(item.obj)\n").replace(
    "class _Collect:", (
        "from unittest import mock\n"
        "class _Anything(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = int.__hash__\n"
        "def _always_equal_add(a, b):\n"
        "    return _Anything(a - b)\n"
        "class _Collect:"))

ATTACKS = {
    "always-equal-result": ALWAYS_EQUAL,
    "swap-test-bodies-profile-hook": SWAP_TEST_BODIES,
    "swap-test-bodies-by-position": SWAP_BY_POSITION,
    "item-obj-swap-collection-plugin": ITEM_OBJ_SWAP,
}
VARIANTS = {
    "eq-only-ints": EQ_ONLY_INTS,
    "eq-only-file-literals": EQ_ONLY_FILE_LITERALS,
    "eq-the-lines-literal": EQ_THE_LINES_LITERAL,
    "swap-known-f2p-code": SWAP_KNOWN_CODE,
    "swap-code-at-the-call": SWAP_AT_THE_CALL,
    "forged-tools-then-swap": FORGED_TOOLS,
    "item-runtest-swap": ITEM_RUNTEST_SWAP,
    "wrapper-swallows-failure": WRAPPER_SWALLOWS,
    "lying-constant": LYING_CONSTANT,
}
STILL_WORKING = {"eq-in-known-frames": EQ_IN_KNOWN_FRAMES, "lying-params": LYING_PARAMS,
                 "patched-while-it-runs": PATCHED_WHILE_IT_RUNS}
# The same non-fixes on the other task shapes: methods of a class, unittest, Django-style.
ELSEWHERE = [(shape, attack) for shape in ("class_task", "unittest_task", "django_task")
             for attack in ("always-equal-result", "swap-test-bodies-profile-hook",
                            "eq-only-file-literals", "swap-known-f2p-code")]
ELSEWHERE += [("class_task", "item-obj-swap-collection-plugin"),
              ("class_task", "item-runtest-swap"), ("class_task", "wrapper-swallows-failure")]
STOPPED = {
    "binary-output-flood": BINARY_FLOOD,
    "deeply-nested-failure-value": DEEP_VALUE,
    "sigkill-self-mid-run": SELF_KILL,
    "fill-the-disk": FILL_THE_DISK,
}
EVERY = {**ATTACKS, **VARIANTS, **STILL_WORKING}
# Which defence speaks, for the variants: the clones (a lying equality passes a clone planted to
# fail), or the code record (the test's own code did not run, or not to its end).
CAUGHT_BY = {
    "eq-only-ints": "planted to fail, was reported PASSED",
    "eq-only-file-literals": "planted to fail, was reported PASSED",
    "eq-the-lines-literal": "planted to fail, was reported PASSED",
    "swap-known-f2p-code": "ran code its file does not define",
    "swap-code-at-the-call": "ran code its file does not define",
    "forged-tools-then-swap": "ran code its file does not define",
    "lying-constant": "ran code its file does not define",
    "item-runtest-swap": "the code its file defines for it never ran",
    "wrapper-swallows-failure": "raised inside something that reported it passed",
}


@pytest.fixture(scope="module")
def params_task(task: DemoTask) -> DemoTask:  # noqa: F811
    """The demo task with only its parametrised test going from failing to passing."""
    return replace(task, fail_to_pass=[t for t in task.fail_to_pass if "[" in t])


@pytest.mark.parametrize("attack", [*ATTACKS, *VARIANTS])
def test_redteam_attack_is_tampered(shared_executor: RunningExecutor, task: DemoTask,  # noqa: F811
                                    attack: str) -> None:
    result = shared_executor.submit(task.request(f"redteam-{attack}",
                                                 _appended(task, EVERY[attack]))).json()
    _assert_tampered(result)
    assert CAUGHT_BY.get(attack, "") in result["error"], result["error"]


@pytest.mark.xfail(strict=True, reason="known gap (README): knowing the FAIL_TO_PASS tests' "
                   "names, equality that lies only in their frames, parameters that lie, or a "
                   "stdlib wrapper patching what they see, run their own code and leave every "
                   "canary (other names) honest")
@pytest.mark.parametrize("attack", list(STILL_WORKING))
def test_redteam_attack_still_working(shared_executor: RunningExecutor,  # noqa: F811
                                      params_task: DemoTask, attack: str) -> None:
    result = shared_executor.submit(params_task.request(
        f"redteam-{attack}", _appended(params_task, EVERY[attack]))).json()
    assert result["canaries"] == PLANTED, result["canaries_skipped"]
    _assert_not_resolved_with_a_verdict(result)


@pytest.mark.parametrize("attack", list(STOPPED))
def test_redteam_stopped(shared_executor: RunningExecutor, task: DemoTask,  # noqa: F811
                         attack: str) -> None:
    result = shared_executor.submit(task.request(f"redteam-{attack}",
                                                 _appended(task, STOPPED[attack]))).json()
    _assert_not_resolved_with_a_verdict(result)


@pytest.mark.parametrize("attack", list(EVERY))
def test_each_attack_forges_without_a_grader(request: pytest.FixtureRequest, tmp_path: Path,
                                             attack: str) -> None:
    """Control: plain pytest over the task's tests with the attack in the package (no reporter,
    no canaries): every FAIL_TO_PASS test passes, so each case above is a real forgery."""
    task: DemoTask = request.getfixturevalue(  # noqa: F811
        "params_task" if attack in STILL_WORKING else "task")
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", task.repo, str(repo)], check=True)
    subprocess.run(["git", "checkout", "-q", task.base_commit], cwd=repo, check=True)
    for patch in (_appended(task, EVERY[attack]), task.test_patch):
        subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=repo, check=True)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                          *task.fail_to_pass], cwd=repo, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"{len(task.fail_to_pass)} passed" in run.stdout, run.stdout[-3000:]


@pytest.mark.slow  # the same attacks on other task shapes
@pytest.mark.parametrize(("shape", "attack"), ELSEWHERE)
def test_redteam_attack_on_other_shapes(shared_executor: RunningExecutor,  # noqa: F811
                                        request: pytest.FixtureRequest, shape: str,
                                        attack: str) -> None:
    demo: DemoTask = request.getfixturevalue(shape)
    body = demo.request(f"redteam-{shape}-{attack}", _appended(demo, EVERY[attack]))
    if shape != "class_task":
        body["log_parser"] = shape.removesuffix("_task")
    result = shared_executor.submit(body).json()
    assert result["canaries"] == PLANTED, result["canaries_skipped"]
    _assert_tampered(result)
