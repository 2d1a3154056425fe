"""Start-up hook for test runs graded by Dockyard (found through PYTHONPATH).

In unittest/Django mode it installs the result hooks of dockyard_report before any test runs;
then it hands over to the environment's own sitecustomize, if there is one, as if we were absent.
"""

import os
import sys


def _dockyard_start():
    if os.environ.get("DOCKYARD_REPORT_MODE") == "unittest":
        import dockyard_report

        dockyard_report.start_unittest()


def _chain_to_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import importlib.machinery
        import importlib.util

        others = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:
        pass


_dockyard_start()
_chain_to_next_sitecustomize()
