"""bprof's hook in every process of a `bprof record` job (put first on PYTHONPATH by the launcher).

Inert unless BPROF_RUN_DIR is set. It imports nothing heavy: it only watches for the training
script's own `import torch` and then installs the rank recorder. Any other sitecustomize on the
path still runs (chain-loaded), so site-specific set-up is kept.
"""

import os
import sys


def _chain_load_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_module = list(sys.path), sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib

        try:
            importlib.import_module("sitecustomize")
        except ImportError:
            pass
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


def _install():
    if not os.environ.get("BPROF_RUN_DIR"):
        return
    try:
        from bprof.profiler.torch_watch import when_torch_imported
        from bprof.profiler import rank_hook
    except Exception as exc:  # never break the user's job because bprof is broken
        print(f"bprof: capture disabled in pid {os.getpid()}: {exc}", file=sys.stderr)
        return
    when_torch_imported(rank_hook.install)


_chain_load_next_sitecustomize()
_install()
