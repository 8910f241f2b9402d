"""Started by ccbridge (PYTHONPATH) in a traced program: note its call sites, then run the
sitecustomize this one shadows (a distribution's or a virtual environment's), if any."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("CCBRIDGE_SITES"):
    import ccbridge_sites

    ccbridge_sites.start(os.environ["CCBRIDGE_SITES"])

_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
if _spec is not None and _spec.loader is not None:
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
    sys.modules["sitecustomize"] = _shadowed  # `import sitecustomize` finds the program's own, as without ccbridge
