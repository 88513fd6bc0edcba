# The interpreter decides at import time: set it before any kernel module is imported.
import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_call_plans():
    """Each test starts without cached call plans (codegen.plan), as a new process would: a test
    that spies on a module's launch() must see the call build its plan."""
    from codegen import plan

    plan.PLANS.clear()
    yield
