"""An integrity record of the test runner's entry points, taken before any test code runs.

Loaded with dockyard_report into the interpreter that runs the tests (no Dockyard import, old
Pythons welcome). Code the tests import can rewrite pytest or unittest so that failures are
reported as passes: replace ``Function.runtest``, ``call_and_report``, ``CallInfo.from_call``,
``TestReport`` or ``TestCase.run``, swap a function's ``__code__``, register a plugin whose
``pytest_runtest_makereport`` flips outcomes. ``watch`` fingerprints those objects (identity of
each function, its code, defaults and closure; of each class's methods and descriptors; of
pluggy's call path) when the reporter loads, before conftest files and collection; ``check``
compares the live objects with it at every report; ``digest`` gives a fingerprint of the live
objects that the reporter writes at start and at the end, so the executor compares the two out of
process (patching the record in memory does not change what the live objects digest to).

Everything lives in closures, not module globals, to make patching the record itself a deliberate
act rather than an accident; it is not a proof (see the README's "What the grader cannot stop").
"""

import hashlib
import operator
import sys

_WATCHED = (
    ("_pytest.runner", ("call_and_report", "runtestprotocol", "call_runtest_hook",
                        "pytest_runtest_protocol", "pytest_runtest_makereport",
                        "pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown",
                        "check_interactive_exception", "CallInfo", "TestReport", "SetupState")),
    ("_pytest.reports", ("TestReport", "BaseReport", "CollectReport")),
    ("_pytest.python", ("Function", "Class", "Module", "pytest_pyfunc_call")),
    ("_pytest.unittest", ("TestCaseFunction", "pytest_runtest_makereport")),
    ("_pytest.main", ("pytest_runtestloop", "Session")),
    ("_pytest.skipping", ("pytest_runtest_makereport", "pytest_runtest_setup",
                          "pytest_runtest_call")),
    ("_pytest.outcomes", ("fail", "skip", "xfail", "exit", "OutcomeException")),
    ("pluggy._callers", ("_multicall",)),
    ("pluggy._hooks", ("HookCaller", "_HookCaller", "HookImpl", "HookRelay")),
    ("pluggy._manager", ("PluginManager",)),
    ("pluggy._result", ("Result", "_Result")),
    ("unittest.case", ("TestCase", "_Outcome", "FunctionTestCase")),
    ("unittest.result", ("TestResult",)),
    ("unittest.suite", ("TestSuite", "BaseTestSuite")),
    ("unittest.runner", ("TextTestResult", "TextTestRunner")),
    ("dockyard_integrity", ("watch", "hook_watch", "_behaviour", "_probes", "_changed",
                            "_targets", "_package", "_only_added", "_nothing_added",
                            "_watched_cells")),
    ("dockyard_code", ("code_hash", "expect", "watcher", "module_file_suffixes", "_compiled",
                       "_functions")),
)
SENSITIVE_HOOKS = (
    "pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport",
    "pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown",
    "pytest_pyfunc_call", "pytest_report_teststatus", "pytest_runtestloop",
)
_ABSENT = object()


def _behaviour(obj, seen):
    """``obj`` and the objects that decide what calling or using it does."""
    out = [obj]
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    for name in ("__func__", "fget", "fset", "fdel", "__wrapped__"):
        inner = getattr(obj, name, None) if not isinstance(obj, type) else None
        if inner is not None:
            out += _behaviour(inner, seen)
    code = getattr(obj, "__code__", None) if not isinstance(obj, type) else None
    if code is not None:
        out += [code, getattr(obj, "__defaults__", None), getattr(obj, "__kwdefaults__", None)]
        out += [contents for _, contents in _watched_cells(obj)]
    if isinstance(obj, type):
        out += list(obj.__mro__) + [type(obj)]
        for key in sorted(vars(obj)):
            value = vars(obj)[key]
            if _behavioural(value):
                out.append(key)
                out += _behaviour(value, seen)
    return out


def _watched_cells(obj):
    """(cell, contents) of ``obj``'s closure cells that hold behaviour (a callable or a mutable
    container): what a patcher would swap to change a function without touching its code."""
    cells = []
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(contents) or isinstance(contents, (list, dict, set)):
            cells.append((cell, contents))
    return cells


def _probes(obj, seen):
    """The same objects as ``_behaviour``, as (fetch, recorded) pairs: ``fetch()`` returns a
    tuple of live objects that must be, one by one, the ``recorded`` ones. Each fetch gathers
    many at C speed (``map``), so a check is cheap enough for every test."""
    probes = []
    if id(obj) in seen:
        return probes
    seen.add(id(obj))
    if isinstance(obj, type):
        namespace = vars(obj)
        keys = tuple(key for key in sorted(namespace) if _behavioural(namespace[key]))
        probes.append((lambda: (obj.__mro__, type(obj)) + tuple(map(namespace.get, keys)),
                       (obj.__mro__, type(obj)) + tuple(namespace[key] for key in keys)))
        probes.append((_nothing_added(namespace, len(keys)), (True,)))
        for key in keys:
            probes += _probes(namespace[key], seen)
        return probes
    names = [name for name in ("__func__", "fget", "fset", "fdel", "__wrapped__")
             if getattr(obj, name, None) is not None]
    inner = [getattr(obj, name) for name in names]
    if getattr(obj, "__code__", None) is not None:
        names += ["__code__", "__defaults__", "__kwdefaults__"]
    if names:
        fetch = operator.attrgetter("__class__", *names)  # a tuple, at C speed
        probes.append((lambda: fetch(obj), fetch(obj)))
    cells = _watched_cells(obj)
    if cells:
        probes.append((lambda: tuple(_contents(cell) for cell, _ in cells),
                       tuple(contents for _, contents in cells)))
    for value in inner:
        probes += _probes(value, seen)
    return probes


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _ABSENT


def _nothing_added(namespace, count):
    """A fetch saying whether ``namespace`` holds no method or descriptor beyond the ``count``
    recorded: the key set is compared first (C speed); only when it changed (pytest marks a
    class with plain data at run time) are the methods and descriptors counted again."""
    known = [frozenset(namespace)]

    def fetch():
        if namespace.keys() == known[0]:
            return (True,)
        if _behavioural_count(namespace) != count:
            return (False,)
        known[0] = frozenset(namespace)
        return (True,)

    return fetch


def _behavioural_count(namespace):
    # Plain data changes at run time (pytest marks classes it warned about); methods do not.
    return sum(1 for value in list(namespace.values()) if _behavioural(value))


def _changed(probes):
    for fetch, recorded in probes:
        try:
            now = fetch()
        except Exception:  # an attribute deleted, a namespace gone
            return True
        if len(now) != len(recorded) or not all(map(operator.is_, now, recorded)):
            return True
    return False


def _targets(extra):
    """(label, getter) for every watched object: module attributes, resolved live each time
    through the module objects held here (replacing ``sys.modules`` entries is watched too)."""
    found = []
    for module_name, names in _WATCHED:
        module = sys.modules.get(module_name)
        if module is None and module_name.startswith("unittest"):
            try:  # the standard library's, cheap; pytest and pluggy are watched once imported
                __import__(module_name)
                module = sys.modules[module_name]
            except Exception:
                continue
        if module is None:
            continue
        found.append((f"sys.modules[{module_name}]",
                      lambda m=module_name: sys.modules.get(m, _ABSENT)))
        namespace = vars(module)
        for name in names:
            if name in namespace:
                found.append((f"{module_name}.{name}",
                              lambda ns=namespace, n=name: ns.get(n, _ABSENT)))
    return found + list(extra)


def watch(extra=()):
    """Take the record now; returns ``(check, digest, settle)``.

    ``check()`` lists the labels whose live objects differ from the record; ``digest()`` maps
    each label to a short hash of the live objects' identities (the record keeps the recorded
    objects alive, so a replacement can never reuse a recorded object's id). ``settle(packages)``
    takes pytest's configuration into the record: plugins of ``packages`` may add to watched
    classes while they configure (pytest's legacypath adds ``Session.startdir``); anything
    else that changed since the record is returned, and the record is taken again."""
    targets = _targets(extra)
    # This module's own functions, held here: replacing them in the module changes nothing the
    # record does (and the module's functions are watched targets too).
    behaviour, probes_of, changed_in, sha256 = _behaviour, _probes, _changed, hashlib.sha256
    only_added = _only_added

    def take(get):
        obj = get()
        namespace = dict(vars(obj)) if isinstance(obj, type) else None
        return obj, namespace, [(lambda: (get(),), (obj,))] + probes_of(obj, set())

    recorded = [take(get) for _, get in targets]

    def check():
        # (zip without strict=: the task's Python may be older than 3.10; same lengths here.)
        return [label for (label, _), (_, _, probes) in zip(targets, recorded)  # noqa: B905
                if changed_in(probes)]

    def digest():
        marks = {}
        for label, get in targets:
            ids = ",".join(str(id(part)) if not isinstance(part, str) else part
                           for part in behaviour(get(), set()))
            marks[label] = sha256(ids.encode()).hexdigest()[:16]
        return marks

    def settle(packages):
        changed = []
        for label in check():
            index = [t[0] for t in targets].index(label)
            before_obj, namespace, _ = recorded[index]
            if namespace is None or targets[index][1]() is not before_obj or not only_added(
                    before_obj, namespace, packages):
                changed.append(label)
        recorded[:] = [take(get) for _, get in targets]
        return changed

    return check, digest, settle


def _only_added(cls, before, packages):
    """Whether ``cls`` differs from its namespace ``before`` only by methods or descriptors
    that code of ``packages`` added (every one it had still the same object)."""
    now = vars(cls)
    if any(key not in now or now[key] is not value for key, value in before.items()
           if _behavioural(value)):
        return False
    return all(_origin(now[key]) in packages for key in set(now) - set(before)
               if _behavioural(now[key]))


def _behavioural(value):
    # Methods and descriptors decide behaviour; plain data (maxDiff = None) does not.
    return callable(value) or hasattr(value, "__get__")


def _origin(value):
    for inner in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
        module = getattr(inner, "__module__", None)
        if module:
            return module.split(".", 1)[0]
    return ""


def hook_watch(pluginmanager):
    """Which plugins may implement the hooks that make reports: those registered when the
    reporter loaded (pytest's own, installed entry points, ``-p`` plugins), objects made by
    their packages, and conftest modules. Returns ``(strangers, packages)``: a function listing
    the other implementers, and those packages."""
    baseline = set(id(p) for p in pluginmanager.get_plugins())
    packages = {"_pytest", "pytest", "pluggy", "dockyard_report"}
    for plugin in pluginmanager.get_plugins():
        packages.add(_package(plugin))
    conftests = getattr(pluginmanager, "_conftest_plugins", set())
    relay = pluginmanager.hook
    inner = getattr(pluginmanager, "_inner_hookexec", None)
    callers = dict((name, getattr(relay, name, None)) for name in SENSITIVE_HOOKS)

    def strangers():
        found = []
        if pluginmanager.hook is not relay:
            found.append("the plugin manager's hook relay was replaced")
        if inner is not None and getattr(pluginmanager, "_inner_hookexec", None) is not inner:
            found.append("the plugin manager's hook executor was replaced")
        for name, caller in callers.items():
            live = getattr(relay, name, None)
            if live is not caller:
                found.append(f"hook {name} was replaced")
                continue
            if caller is None:
                continue
            for impl in caller.get_hookimpls():
                plugin = impl.plugin
                if id(plugin) in baseline or _package(plugin) in packages:
                    continue
                if plugin in conftests or str(getattr(plugin, "__file__", "")).endswith(
                        "conftest.py"):
                    continue
                found.append(f"plugin {impl.plugin_name} implements {name}")
        return found

    return strangers, packages


def _package(plugin):
    name = getattr(plugin, "__name__", None) if isinstance(plugin, type(sys)) else None
    if name is None:
        name = getattr(type(plugin), "__module__", "") or ""
    return name.split(".", 1)[0]
