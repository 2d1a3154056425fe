"""Per-test results written to a private file, loaded into the interpreter that runs the tests.

This file is copied into nothing and imports nothing from Dockyard: it runs inside the task's own
Python (which may be old), found through PYTHONPATH. It records every test outcome as one JSON line
in the file named by DOCKYARD_REPORT_FILE, opened before any test code runs. The executor reads
verdicts from this file only, never from the test output, so lines printed by the code under test
("PASSED tests/test_x.py::test_y") cannot forge a result.

pytest: loaded as a plugin through PYTEST_PLUGINS. unittest and Django's runtests.py: hooks on
unittest.TestResult, installed by the sitecustomize module beside this one.

Both modes also keep an integrity record of the runner (dockyard_integrity): a fingerprint of its
entry points written at start and at the end, and a ``tamper`` line whenever a report finds them
changed; and a code record (dockyard_code): what each test file defines, and what each test's
call actually ran.
"""

import atexit
import json
import os

import dockyard_code
import dockyard_integrity

_stream = None
_MODE = os.environ.get("DOCKYARD_REPORT_MODE")
# Read (and dropped, so nested runs do not check against it) before any test code runs.
_CODE_FILES = os.environ.pop("DOCKYARD_CODE_FILES", None)


def _open_once():
    # Open the file and drop the variables, so subprocesses of the tests (including nested test
    # runs, as in pytest's own test suite) neither inherit the path nor report into it.
    global _stream
    if _stream is None:
        path = os.environ.pop("DOCKYARD_REPORT_FILE", None)
        os.environ.pop("PYTEST_PLUGINS", None)
        os.environ.pop("DOCKYARD_REPORT_MODE", None)
        if path:
            _stream = open(path, "a", buffering=1, encoding="utf-8", errors="surrogateescape")
    return _stream


def record(**fields):
    stream = _open_once()
    if stream is not None:
        stream.write(json.dumps(fields, sort_keys=True) + "\n")
        stream.flush()


# ----------------------------------------------------------------------------- pytest plugin hooks

# Only the outer session reports: the variables that load this plugin are gone by the time any
# nested session (pytester, a subprocess) starts, so nested sessions never register these hooks.


def pytest_configure(config):
    _open_once()


def pytest_addhooks(pluginmanager):
    # Called as this plugin is registered: the plugins there now are pytest's own, installed
    # entry points and -p plugins; the conftest files and the tests come later.
    _guard.watch_hooks(pluginmanager)


# A session's start and finish bracket its reports: a start without a finish is a run that died
# mid-way, and the reports since the last start are what pytest's own summary line counts.


def pytest_sessionstart(session):
    _guard.settle()
    record(kind="session", event="start")


def pytest_sessionfinish(session, exitstatus):
    _guard.verify()
    _guard.finish()
    record(kind="session", event="finish", exitstatus=int(exitstatus))


def pytest_collectreport(report):
    if report.failed:
        record(kind="collect", id=report.nodeid, outcome="error")


def pytest_runtest_logreport(report):
    record(
        kind="test",
        id=report.nodeid,
        when=report.when,
        outcome=report.outcome,
        wasxfail=hasattr(report, "wasxfail"),
        xfail_marked=bool(getattr(report, "dockyard_xfail_marked", False)),
        # Run by a pytest-xdist worker (which loads no reporter): no code record to expect.
        remote=getattr(report, "node", None) is not None,
    )
    if report.when == "call" or report.outcome != "passed":
        _guard.verify()  # where outcomes are decided (each test's call), and every failure


def _node_key(nodeid):
    """(file, qualname) of a pytest node id: ``a/test_x.py::TestA::test_b[1]``."""
    parts = nodeid.split("[", 1)[0].split("::")
    return parts[0], ".".join(parts[1:])


def _mark_declared_xfail(item, report):
    # An xfail counts as a pass only when the test itself declares it; code under test that
    # calls pytest.xfail() must not turn a failure into a pass.
    report.dockyard_xfail_marked = item.get_closest_marker("xfail") is not None


try:
    import pytest

    try:

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            report = yield
            _mark_declared_xfail(item, report)
            return report

    except TypeError:  # pluggy < 1.2 knows only old-style wrappers

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):  # noqa: F811
            outcome = yield
            _mark_declared_xfail(item, outcome.get_result())

    # The code record's window: the innermost wrapper of the call of a test function, so that
    # nothing but the runner's own implementation runs between it and the test's frame.
    try:

        @pytest.hookimpl(wrapper=True, trylast=True)
        def pytest_pyfunc_call(pyfuncitem):
            token = _guard.open_item(pyfuncitem)
            try:
                return (yield)
            finally:
                _guard.close_window(token)

    except TypeError:

        @pytest.hookimpl(hookwrapper=True, trylast=True)
        def pytest_pyfunc_call(pyfuncitem):  # noqa: F811
            token = _guard.open_item(pyfuncitem)
            try:
                yield
            finally:
                _guard.close_window(token)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(item):
        _guard.current[:] = [item.nodeid]  # unittest's _callTestMethod names it by this id

except ImportError:  # no pytest in this interpreter: the unittest hooks below still work
    pass



# ----------------------------------------------------------------------------- unittest hooks


def _aliases(test):
    """Names under which a unittest/Django test may appear in FAIL_TO_PASS / PASS_TO_PASS."""
    names = []
    test_id = test.id()
    names.append(test_id)
    method = getattr(test, "_testMethodName", None)
    cls = type(test)
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    if method:
        names.append(f"{method} ({class_path})")
        names.append(f"{method} ({class_path}.{method})")
    try:
        names.append(str(test))
        doc = test.shortDescription()
        if doc:
            names.append(doc)
    except Exception:
        pass
    seen = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


def install_unittest_hooks():
    import unittest

    base = unittest.TestResult
    originals = {}

    def wrap(method_name, outcome):
        original = getattr(base, method_name)
        originals[method_name] = original

        def hooked(self, test, *args):
            try:
                if hasattr(test, "id") and type(test).__name__ != "_ErrorHolder":
                    record(kind="unittest", id=test.id(), aliases=_aliases(test), outcome=outcome)
                else:
                    record(kind="unittest", id=str(test), aliases=[str(test)], outcome=outcome)
                _guard.verify()
            except Exception:
                pass
            return original(self, test, *args)

        setattr(base, method_name, hooked)

    wrap("addSuccess", "passed")
    wrap("addFailure", "failed")
    wrap("addError", "error")
    wrap("addSkip", "skipped")
    wrap("addExpectedFailure", "xfailed")
    wrap("addUnexpectedSuccess", "failed")

    original_subtest = base.addSubTest

    def hooked_subtest(self, test, subtest, err):
        if err is not None:
            try:
                record(kind="unittest", id=test.id(), aliases=_aliases(test), outcome="failed")
            except Exception:
                pass
        return original_subtest(self, test, subtest, err)

    base.addSubTest = hooked_subtest


# ----------------------------------------------------------------------------- integrity record


class _Guard:
    """The integrity record of this run, checked at every report (dockyard_integrity)."""

    def __init__(self):
        self.verify = lambda: None
        self.finish = lambda: None
        self.settle = lambda: None
        self.watch_hooks = lambda pluginmanager: None
        self.open_item = lambda item: None
        self.close_window = lambda token: None
        self.current = []

    def start(self, settled=True):
        """Record the runner's entry points now (before any test code), and write their marks
        if ``settled`` (else ``settle`` does, once pytest is configured). The record covers
        this module's own hooks and this guard's functions too."""
        namespace = globals()
        stream = _open_once()
        dumps = json.dumps

        def write(**fields):
            # The stream itself, held here: replacing the module's ``record`` or ``_stream``
            # does not silence the record (a file object's methods cannot be replaced).
            if stream is not None:
                stream.write(dumps(fields, sort_keys=True) + "\n")
                stream.flush()

        told = set()
        strangers = []
        packages = set()
        taken = []  # (check, digest, settle), once the record is taken

        def tell(found):
            for what in found:
                if what not in told:
                    told.add(what)
                    write(kind="tamper", what=what)

        def verify():
            found = taken[0][0]()
            for look in strangers:
                found += look()
            tell(found)

        def settle():
            tell(taken[0][2](packages))
            write(kind="integrity", event="start", marks=taken[0][1]())

        def finish():
            write(kind="integrity", event="finish", marks=taken[0][1]())

        def watch_hooks(pluginmanager):
            if not strangers:
                look, known = dockyard_integrity.hook_watch(pluginmanager)
                strangers.append(look)
                packages.update(known)

        self.verify, self.finish, self.watch_hooks = verify, finish, watch_hooks
        self.settle = settle
        self._start_code_check(write)
        own = [(f"dockyard_report.{name}", lambda n=name: namespace.get(n))
               for name in ("record", "_open_once", "pytest_runtest_logreport",
                            "pytest_sessionstart", "pytest_sessionfinish", "pytest_addhooks",
                            "pytest_collectreport", "pytest_runtest_makereport", "_guard",
                            "pytest_pyfunc_call", "pytest_runtest_call", "_node_key")]
        own += [(f"dockyard_report._guard.{name}", lambda n=name: getattr(self, n, None))
                for name in ("verify", "finish", "settle", "watch_hooks", "open_item",
                             "close_window")]
        taken.append(dockyard_integrity.watch(own))
        if settled:
            record(kind="integrity", event="start", marks=taken[0][1]())


    def _start_code_check(self, write):
        """The code record (dockyard_code): the test files' functions now, then a window
        around each test's call (pytest's ``pytest_pyfunc_call``; unittest's
        ``_callTestMethod``, wrapped here, before the integrity record is taken)."""
        try:
            named = json.loads(_CODE_FILES) if _CODE_FILES else {}
        except ValueError:
            named = {}
        files = named.get("files") if isinstance(named, dict) else None
        if not isinstance(files, dict) or not files:
            return
        root = named.get("root")
        if not isinstance(root, str) or not os.path.isdir(root):
            root = os.getcwd()
        expected, status = dockyard_code.expect(files, root)
        write(kind="code", event="expected", files=status,
              functions={rel: {q: sorted(h) for q, h in table.items()}
                         for rel, table in expected.values()})
        open_window, close_window = dockyard_code.watcher(expected, write)
        node_key, current = _node_key, self.current
        try:
            import _pytest.python

            pyfunc_call = _pytest.python.pytest_pyfunc_call.__code__
        except Exception:
            pyfunc_call = None

        def open_item(item):
            path, qualname = node_key(item.nodeid)
            return open_window(item.nodeid, [path], qualname, pyfunc_call)

        self.open_item, self.close_window = open_item, close_window
        _wrap_test_method_calls(open_window, close_window, current)


def _wrap_test_method_calls(open_window, close_window, current):
    """unittest's ``_callTestMethod`` (3.8+; the asyncio case's too) with the window around
    it; the test is named as pytest names it when pytest runs it, else by its unittest id."""
    import unittest

    classes = [unittest.TestCase]
    try:
        from unittest import IsolatedAsyncioTestCase

        classes.append(IsolatedAsyncioTestCase)
    except ImportError:
        pass
    node_key, suffixes_of = _node_key, dockyard_code.module_file_suffixes
    for cls in classes:
        original = vars(cls).get("_callTestMethod")
        if original is None:
            continue

        def wrapped(self, method, _original=original, _direct=original.__code__):
            kind = type(self)
            qualname = f"{kind.__qualname__}.{self._testMethodName}"
            token = None
            if not current:
                token = open_window(self.id(), suffixes_of(kind.__module__), qualname, _direct)
            elif node_key(current[0])[1] == qualname:  # not a TestCase run inside a test
                token = open_window(current[0], [node_key(current[0])[0]], qualname, _direct)
            try:
                return _original(self, method)
            finally:
                close_window(token)

        cls._callTestMethod = wrapped


_guard = _Guard()


def start_unittest():
    """unittest/Django mode: result hooks first, then the record (it includes them); the final
    marks at exit, when the runner has printed its summary."""
    install_unittest_hooks()
    _guard.start()
    atexit.register(lambda: _guard.finish())


if _MODE == "pytest":
    _guard.start(settled=False)
