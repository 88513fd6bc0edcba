"""Eager calls on two streams never share a buffer (README "CUDA graphs, streams", docs/contract.md):
call plans, which own the split-K partials and arrival counters, are kept per stream (the stream is
part of codegen.plan.call_key's key and of a StepPlan's). The CPU has no streams, so the stream id
the keys see is set here (codegen.plan.device_state); the GPU suite runs the same on real streams
(tests/gpu/test_plans_gpu.py)."""
import pytest
import torch

from codegen import LaunchConfig, cases, plan, plan_decode
from codegen.accuracy import compare

STREAMS = (11, 22)


@pytest.fixture
def on_stream(monkeypatch):
    """Sets the stream that the following calls are made on (as `with torch.cuda.stream(s)`)."""
    current = {"stream": 0}
    monkeypatch.setattr(plan, "device_state", lambda q: (-1, current["stream"], False))
    return lambda stream: current.update(stream=stream)


def _owned(call_plan) -> set[int]:
    """Addresses of the buffers a plan's launches allocated and keep (partials, counters): the
    call's own tensors are not kept in a bound launch."""
    return {t.data_ptr() for launch in call_plan.launches for t in launch.args if isinstance(t, torch.Tensor)}


def _run_checked(case, **kw):
    case.poison()
    out = cases.run_kernel(case, arch="sm90", **kw)
    assert compare(out, cases.run_reference(case), torch.float32).ok


def _assert_a_plan_per_stream(plans: list) -> None:
    """The calls on two streams (each stream twice, one call shape) kept two plans, whose buffers
    are their own: one plan would serve both streams with the same buffers."""
    assert len(plans) == len(STREAMS), f"{len(plans)} plan(s) for calls on {len(STREAMS)} streams"
    first, second = (_owned(kept) for kept in plans)
    assert first and second, "these calls' plans own buffers"
    assert not first & second, "two streams' plans share a buffer"


def _decode():
    return cases.decode_case(arch="sm90", seq_lens=[300, 700], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="scalar", seed=7)


DECODE_CONFIG = LaunchConfig(block_n=32, num_splits=2, fused_merge=1)  # partials and arrival counters


def test_decode_on_two_streams_gets_a_plan_and_buffers_per_stream(on_stream):
    case = _decode()
    for stream in STREAMS + STREAMS:  # the second round reuses each stream's plan
        on_stream(stream)
        _run_checked(case, config=DECODE_CONFIG)
    _assert_a_plan_per_stream(list(plan.PLANS._plans.values()))


def test_prefill_on_two_streams_gets_a_plan_and_buffers_per_stream(on_stream):
    """`auto` selection: the decision launch's counters are the plan's own."""
    case = cases.prefill_case(arch="sm90", q_lens=[5, 6], prefix_lens=[0, 600], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, topk=4, scale_mode="scalar", seed=7)
    for stream in STREAMS + STREAMS:
        on_stream(stream)
        _run_checked(case, config=LaunchConfig(block_n=32, block_t=2), selection="auto")
    _assert_a_plan_per_stream(list(plan.PLANS._plans.values()))


def test_a_step_plan_keeps_a_plan_per_stream(on_stream):
    case = _decode()
    a = case.args
    step = plan_decode(a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"], a["decode_query_len"],
                       arch="sm90", config=DECODE_CONFIG)
    for stream in STREAMS + STREAMS:
        on_stream(stream)
        case.poison()
        step.run(a["q"], a["kv_cache"], a["topk_idx"], a["output"], a["k_scale"], a["v_scale"])
        assert compare(case.output, cases.run_reference(case), torch.float32).ok
    _assert_a_plan_per_stream(list(step._plans.values()))
