"""A preparer process (trial.prepare) and the run's GPU: inputs too large to keep are built, compiled
against and given back while the GPU lock is held, so that a dozen preparers never hold a large
bucket's inputs at once beside a trial (H200, 2026-12-03: decode 64x4@512, 14 GiB each, every trial
ran out of memory). No GPU here: the CUDA calls, the build, the lock and the compile are stand-ins
that record their order."""
import contextlib

import pytest
import torch

from codegen.configs import LaunchConfig
from codegen.static import jit
from codegen.tuning import trial
from codegen.tuning.buckets import Bucket
from codegen.tuning.settings import TuneSettings


@pytest.fixture
def recorded(monkeypatch):
    events = []

    @contextlib.contextmanager
    def held(path):
        events.append("lock")
        try:
            yield
        finally:
            events.append("unlock")

    @contextlib.contextmanager
    def compiled_not_launched():
        yield []

    def build_case(self, **kwargs):
        events.append("build")
        return object()

    monkeypatch.setattr(trial, "held", held)
    monkeypatch.setattr(trial, "_on_arch", lambda arch: False)
    monkeypatch.setattr(trial, "run_kernel", lambda case, config: events.append("compile"))
    monkeypatch.setattr(trial, "_keep_bytes", lambda: 100)
    monkeypatch.setattr(jit, "compiled_not_launched", compiled_not_launched)
    monkeypatch.setattr(Bucket, "build_case", build_case)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("give back"))
    monkeypatch.setattr(trial, "_first_sets", {})
    return events


def _prepare(monkeypatch, input_bytes: int) -> None:
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: input_bytes if trial._first_sets else 0)
    bucket = Bucket("decode", "sm90", "NVIDIA_H200", "scalar", "fp8", 64, 512, 4, 8192)
    request = dict(TuneSettings(storage="").request(bucket, LaunchConfig()), static=False, precompile=True,
                   interpret=False, gpu_lock="/nonexistent/lock")
    assert trial.prepare(request) == []


def test_large_inputs_hold_the_gpu_from_their_build_until_they_are_given_back(recorded, monkeypatch):
    _prepare(monkeypatch, input_bytes=1000)
    assert recorded == ["lock", "build", "compile", "give back", "unlock"]
    assert not trial._first_sets


def test_small_inputs_free_the_gpu_after_their_build_and_stay_for_the_next_candidate(recorded, monkeypatch):
    _prepare(monkeypatch, input_bytes=10)
    assert recorded == ["lock", "build", "unlock", "compile"]
    _prepare(monkeypatch, input_bytes=10)  # the same bucket again: no build, no lock
    assert recorded == ["lock", "build", "unlock", "compile", "compile"]
