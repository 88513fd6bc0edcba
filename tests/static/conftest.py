# Static gates compile for real (ahead of time, no GPU): the Triton interpreter must be off in this
# process. TRITON_INTERPRET=1 inherited from the shell once made every test here a silent skip
# (issue 39): it is unset here, before any test module imports Triton (which reads it when a
# @triton.jit function is defined), and xdist's workers, started after this, inherit the unset.
# Triton imported with the interpreter on before this file (the interpreter suite's conftest in
# the same process, say) cannot be undone: the session stops and says so.
import os
import sys

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
UNSET = os.environ.pop("TRITON_INTERPRET", None)  # what this process was given, for the header


def interpreter_loaded() -> bool:
    """Whether Triton's own @triton.jit functions were already defined as interpreted ones."""
    tl = sys.modules.get("triton.language")
    if tl is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(getattr(tl.standard, "max", None), InterpretedFunction)


if interpreter_loaded():
    raise pytest.UsageError("tests/static: Triton was imported with TRITON_INTERPRET=1 before tests/static/conftest.py "
                            "could unset it; run tests/static in its own pytest process (scripts/test.sh does)")


def pytest_report_header(config):
    if UNSET is not None:
        return f"tests/static: TRITON_INTERPRET={UNSET} unset for this process (the gates compile ahead of time)"
    return None
