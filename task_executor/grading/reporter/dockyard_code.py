"""What test code ran: each test function's code object against its file, compiled from disk.

Loaded with dockyard_report into the interpreter that runs the tests (no Dockyard import, old
Pythons welcome). Code the tests import can leave the runner alone and change the tests
instead: swap a test function's ``__code__`` for a no-op, point a pytest item's ``obj`` or
``runtest`` elsewhere, replace a method of a TestCase class. The executor names the files the
test patch wrote, their SHA-256 and the tree they are in (``DOCKYARD_CODE_FILES``); ``expect``
reads and compiles them as the loader will (plain, and assertion-rewritten as pytest does),
when the reporter loads, before conftest files, collection or any code of the agent's has run,
and records a digest of every function and method the files define. ``watcher`` then opens a
window around each test's call (the last moment before it: the innermost hook wrapper of
``pytest_pyfunc_call``, or unittest's ``_callTestMethod``) with a profile hook that catches the
frame of the test function as it starts: the digest of the code that actually runs, whether
pytest (or unittest) called it directly, and, when something else did (a decorator), whether
that frame returned rather than raised. The reporter writes both, and the executor, outside
the sandbox, judges them (``task_executor.grading.code_check``): a required test that passed
must have run its file's code.

Everything the check calls is held in closures taken at load (``compile``, ``hashlib``,
``repr``...), so patching those modules or builtins later changes nothing it computes.
"""

import dis
import hashlib
import os
import sys
import types
import warnings

_CO_OPTIMIZED = 0x1
_RESUMABLE = 0x20 | 0x80 | 0x200  # generator, coroutine, async generator: 'return' on yield too


def _make_hasher():
    """``code_hash(code)``: a digest of everything that decides what ``code`` does (its file
    name aside). A constant of any type but the plain builtin ones (an ``int`` subclass whose
    ``repr`` says 5 and whose ``__eq__`` says yes) makes the digest unique, so never expected."""
    sha, code_type, plain = hashlib.sha256, types.CodeType, (
        int, float, complex, str, bytes, bool, type(None), type(Ellipsis))
    text, kind, attribute, ident = repr, type, getattr, id
    fields = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals",
              "co_flags", "co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars",
              "co_name", "co_qualname", "co_firstlineno", "co_linetable", "co_lnotab",
              "co_exceptiontable")

    def describe(value, out):
        value_kind = kind(value)
        if value_kind is code_type:
            for name in fields:
                part = attribute(value, name, None)
                if kind(part) is tuple and not all(kind(p) is str for p in part):
                    out.append(f"foreign name {ident(part)}")
                else:
                    out.append(text(part))
            for const in value.co_consts:
                describe(const, out)
        elif value_kind in (tuple, frozenset):
            out.append(value_kind.__name__ + "(")
            for item in (value if value_kind is tuple else sorted(value, key=text)):
                describe(item, out)
            out.append(")")
        elif value_kind in plain:
            out.append(value_kind.__name__ + ":" + text(value))
        else:
            out.append(f"foreign {ident(value)}")

    def code_hash(code):
        out = []
        describe(code, out)
        return sha("\x00".join(out).encode("utf-8", "surrogateescape")).hexdigest()[:24]

    return code_hash


code_hash = _make_hasher()


class _Ini:
    """The one setting pytest's assertion rewriter reads from its config."""

    def __init__(self, pass_hook):
        self.pass_hook = pass_hook

    def getini(self, name):
        return self.pass_hook if name == "enable_assertion_pass_hook" else None


def _compiled(data, path):
    """The module code objects the loader may make of ``data``: plain, and rewritten by the
    task's own pytest (with and without the assertion pass hook) when it has one."""
    codes = [compile(data, path, "exec", dont_inherit=True)]
    try:
        import ast

        from _pytest.assertion.rewrite import rewrite_asserts
    except Exception:
        return codes
    for pass_hook in (False, True):
        tree = ast.parse(data, filename=path)
        try:
            rewrite_asserts(tree, data, path, _Ini(pass_hook))
        except TypeError:  # pytest < 5: no source argument
            rewrite_asserts(tree, path, _Ini(pass_hook))
        codes.append(compile(tree, path, "exec", dont_inherit=True))
    return codes


def _functions(code, prefix, table):
    """{qualname: {digest}} of the functions and methods ``code`` defines (not nested ones)."""
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        if const.co_flags & _CO_OPTIMIZED:
            table.setdefault(prefix + const.co_name, set()).add(code_hash(const))
        else:  # a class body
            _functions(const, prefix + const.co_name + ".", table)


def expect(files, root):
    """``(expected, status)``: ``expected`` maps each readable file's real path to
    ``(relative path, {qualname: {digest}})``; ``status`` says per file ``checked``,
    ``missing``, ``changed`` (not the bytes the executor wrote) or ``unchecked`` (not
    compilable here, so not judged)."""
    expected, status = {}, {}
    for rel, digest in sorted(files.items()):
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            status[rel] = "missing"
            continue
        if hashlib.sha256(data).hexdigest() != digest:
            status[rel] = "changed"
            continue
        table = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for code in _compiled(data, path):
                    _functions(code, "", table)
        except Exception:
            status[rel] = "unchecked"
            continue
        expected[os.path.realpath(path)] = (rel, table)
        status[rel] = "checked"
    return expected, status


def watcher(expected, write):
    """``(open_window, close_window)`` around one test's call.

    ``open_window(test_id, suffixes, qualname, direct)``: the test named ``qualname`` in the
    checked file ending with one of ``suffixes`` is about to be called by the frame running
    ``direct`` (a code object); returns a token for ``close_window``, which writes what ran."""
    set_profile, get_profile = sys.setprofile, sys.getprofile
    digest_of = code_hash
    returns = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
    opnames = list(dis.opname)
    by_suffix = [(path.replace(os.sep, "/"), rel, table)
                 for path, (rel, table) in expected.items()]

    def find(suffixes, qualname):
        for path, rel, table in by_suffix:
            for suffix in suffixes:
                if (path == suffix or path.endswith("/" + suffix)) and qualname in table:
                    return rel
        return None

    def open_window(test_id, suffixes, qualname, direct):
        rel = find(suffixes, qualname)
        if rel is None:
            return None
        name = qualname.rpartition(".")[2]
        seen = {"id": test_id, "file": rel, "qualname": qualname, "hash": None,
                "direct": None, "returned": None}
        target = []  # the code first caught under the test's name
        running = []  # its frames not yet finished
        previous = get_profile()

        def profile(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if target:
                    if code is target[0]:
                        running.append(frame)
                    return
                if code.co_name != name:
                    return
                target.append(code)
                seen["hash"] = digest_of(code)
                caller = frame.f_back
                seen["direct"] = caller is not None and caller.f_code is direct
                if seen["direct"]:
                    set_profile(previous)  # its exceptions reach the runner: nothing to wait for
                else:
                    running.append(frame)
            elif event == "return" and running and frame is running[-1]:
                code, at = frame.f_code, frame.f_lasti
                if code.co_flags & _RESUMABLE and at < len(code.co_code) and \
                        opnames[code.co_code[at]].startswith(("YIELD", "SEND")):
                    return  # suspended, not finished
                running.pop()
                # A wrapper may call the test more than once (hypothesis: some examples stop
                # at ``assume``): one run of it to its end is what a pass needs.
                if code.co_code[at] in returns:
                    seen["returned"] = True
                elif seen["returned"] is None:
                    seen["returned"] = False

        set_profile(profile)
        return seen, profile, previous

    def close_window(token):
        if token is None:
            return
        seen, profile, previous = token
        if get_profile() is profile:
            set_profile(previous)
        write(kind="code", event="ran", **seen)

    return open_window, close_window


def module_file_suffixes(module_name):
    """Where a module named ``module_name`` lives, relative to some root on sys.path."""
    base = module_name.replace(".", "/")
    return [base + ".py", base + "/__init__.py"]
