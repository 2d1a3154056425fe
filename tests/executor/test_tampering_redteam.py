"""Red team: patches that fix nothing and try to come back ``resolved`` (or with no verdict).

Each attack is appended to the demo package (``calc/__init__.py``, imported by the held-out
tests at collection) and graded through ``POST /task/submit`` on a real executor, as
tests/executor/test_tampering.py does. None of these touches a runner entry point the
integrity record watches, and each tells the task's tests from the canaries without knowing
their names. An attack that works today is marked ``xfail(strict=True)``: the test asserts the
right outcome (no ``resolved``, a verdict), so it starts passing once the grader stops it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from task_executor.demo import DemoTask, diff_of
from tests.conftest import RunningExecutor
from tests.executor.test_tampering import (  # noqa: F401  (fixtures)
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

WORKING = {
    "always-equal-result": ALWAYS_EQUAL,
    "swap-test-bodies-profile-hook": SWAP_TEST_BODIES,
    "swap-test-bodies-by-position": SWAP_BY_POSITION,
    "item-obj-swap-collection-plugin": ITEM_OBJ_SWAP,
}
# The same non-fixes on the other task shapes: methods of a class, unittest, Django-style.
WORKING_ELSEWHERE = [("class_task", "always-equal-result"),
                     ("class_task", "swap-test-bodies-profile-hook"),
                     ("class_task", "item-obj-swap-collection-plugin"),
                     ("unittest_task", "always-equal-result"),
                     ("unittest_task", "swap-test-bodies-profile-hook"),
                     ("django_task", "always-equal-result"),
                     ("django_task", "swap-test-bodies-profile-hook")]
STOPPED = {
    "binary-output-flood": BINARY_FLOOD,
    "deeply-nested-failure-value": DEEP_VALUE,
    "sigkill-self-mid-run": SELF_KILL,
    "fill-the-disk": FILL_THE_DISK,
}


RESOLVED_NON_FIX = pytest.mark.xfail(
    strict=True, reason="red team: a patch that fixes nothing is resolved; the canaries never "
    "call the package, so an attack that acts only on tests that do (or only above the file's "
    "last call of it) leaves them honest, and no watched runner object changes")


@RESOLVED_NON_FIX
@pytest.mark.parametrize("attack", list(WORKING))
def test_redteam_attack(shared_executor: RunningExecutor, task: DemoTask,  # noqa: F811
                        attack: str) -> None:
    result = shared_executor.submit(task.request(f"redteam-{attack}",
                                                 _appended(task, WORKING[attack]))).json()
    _assert_not_resolved_with_a_verdict(result)


@pytest.mark.parametrize("attack", list(STOPPED))
def test_redteam_stopped(shared_executor: RunningExecutor, task: DemoTask,  # noqa: F811
                         attack: str) -> None:
    result = shared_executor.submit(task.request(f"redteam-{attack}",
                                                 _appended(task, STOPPED[attack]))).json()
    _assert_not_resolved_with_a_verdict(result)


@pytest.mark.slow  # the same attacks on other task shapes: known gaps, kept out of the default tier
@RESOLVED_NON_FIX
@pytest.mark.parametrize(("shape", "attack"), WORKING_ELSEWHERE)
def test_redteam_attack_on_other_shapes(shared_executor: RunningExecutor,  # noqa: F811
                                        request: pytest.FixtureRequest, shape: str,
                                        attack: str) -> None:
    demo: DemoTask = request.getfixturevalue(shape)
    body = demo.request(f"redteam-{shape}-{attack}", _appended(demo, WORKING[attack]))
    if shape != "class_task":
        body["log_parser"] = shape.removesuffix("_task")
    result = shared_executor.submit(body).json()
    assert result["canaries"] == 3, result["canaries_skipped"]  # guarded, and still forged
    _assert_not_resolved_with_a_verdict(result)
