"""A preparer process (trial.prepare) gives back the memory its build of a bucket's inputs freed
(the KV cache's fp32 draw) before it compiles; giving back a large bucket's inputs gives back the plans its
compile made too: a plan's buffers carved from the inputs' allocator segment would keep the segment
reserved. No GPU here: the CUDA calls, the build and the compile are stand-ins; the compile leaves a
plan and a step memo, as the API's first call does."""
import contextlib

import pytest
import torch

from codegen import plan
from codegen.configs import LaunchConfig
from codegen.static import jit
from codegen.tuning import trial
from codegen.tuning.buckets import Bucket
from codegen.tuning.settings import TuneSettings


@pytest.fixture
def prepare(monkeypatch):
    events = []

    @contextlib.contextmanager
    def compiled_not_launched():
        yield []

    def compile_one(case, config):
        events.append("compile")
        plan.PLANS.put(("stand-in", len(events)), type("Plan", (), {"nbytes": 0, "fresh": lambda self: True})())
        plan._step_memo["decode"] = ("step tensors",)

    monkeypatch.setattr(trial, "_on_arch", lambda arch: False)
    monkeypatch.setattr(trial, "run_kernel", compile_one)
    monkeypatch.setattr(trial, "_keep_bytes", lambda: 100)
    monkeypatch.setattr(jit, "compiled_not_launched", compiled_not_launched)
    monkeypatch.setattr(Bucket, "build_case", lambda self, **kwargs: events.append("build") or object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("give back"))
    monkeypatch.setattr(trial, "_first_sets", {})
    monkeypatch.setattr(plan, "PLANS", plan.PlanCache())
    monkeypatch.setattr(plan, "_step_memo", {})

    def run(input_bytes: int) -> list:
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: input_bytes if trial._first_sets else 0)
        bucket = Bucket("decode", "sm90", "NVIDIA_H200", "scalar", "fp8", 64, 512, 4, 8192)
        request = dict(TuneSettings(storage="").request(bucket, LaunchConfig()), static=False, precompile=True,
                       interpret=False)
        assert trial.prepare(request) == []
        return events

    return run


def test_large_inputs_are_given_back_with_the_plans_their_compile_made(prepare):
    assert prepare(input_bytes=1000) == ["build", "give back", "compile", "give back"]
    assert not trial._first_sets and len(plan.PLANS) == 0 and not plan._step_memo


def test_small_inputs_and_their_plans_stay_for_the_next_candidate(prepare):
    # The build's freed temporaries go back at once (the fp32 draw of the KV cache); the inputs stay.
    assert prepare(input_bytes=10) == ["build", "give back", "compile"]
    assert prepare(input_bytes=10) == ["build", "give back", "compile", "compile"]  # the same bucket: built once
    assert len(plan.PLANS) == 2 and plan._step_memo
