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


@pytest.fixture
def launches(monkeypatch):
    """Every generated module's launch() spied on (codegen.modules.load_module(...).launch, which
    the API calls), and prefill's decision launch: the names of the variants launched, in order.
    A plan records its launches through launch() before it runs them, so bad input must leave this
    empty, whatever a launch would have written (output, split-K partials or counters)."""
    from codegen import selection_kernel
    from codegen.modules import load_module
    from codegen.variants import all_variants

    seen = []

    def spy(owner, attr, name):
        real = getattr(owner, attr)

        def launch(*args, **kwargs):
            seen.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, attr, launch)

    for v in all_variants():
        spy(load_module(v.arch, v.kernel, v.scale_mode, v.fold_scales), "launch", v.name)
    spy(selection_kernel, "decide_and_split", "selection")
    return seen
