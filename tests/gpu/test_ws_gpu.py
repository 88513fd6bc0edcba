"""GPU accuracy gates of the warp-specialized Gluon prefill tile (prefill_ws, sm90 only).

The Gluon kernel cannot run under the Triton interpreter, so these are its accuracy gates; the CPU
suite checks its plan kernel (tests/interp/test_ws_plan.py) and the static gate compiles it for sm90.
Every case poisons the output (NaN) and, where it says so, the slots past each request's end (NaN in
the fp8 encoding): the converter must zero V there, and rows past a request's end must stay unwritten.
"""

import pytest
import torch

from codegen import cases, gpu_suite
from codegen import plan as call_plans
from codegen.accuracy import compare
from codegen.configs import ws_config
from codegen.shapes import SERVING_LAYOUTS
from codegen.validate import detect_device_arch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

MODES = ("scalar", "per_token_head")


@pytest.fixture(scope="module")
def arch():
    arch = detect_device_arch(torch.device("cuda"))
    if arch != "sm90":
        pytest.skip(f"the Gluon tile is written for sm90, this GPU is {arch}")
    return arch


def _case(arch, mode, layout, *, seed=0, **kw):
    hq, hkv = SERVING_LAYOUTS[layout]
    args = dict(q_lens=[300, 77, 1000, 5], prefix_lens=[0, 200, 1500, 129], pattern="random", future_prob=0.3,
                tail="mixed", inner_junk=0.1)
    args.update(kw)
    return cases.prefill_case(arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype="fp8", scale_mode=mode,
                              q_dtype=torch.bfloat16, device="cuda", seed=seed, **args)


def _duplicate_listing(case):
    """Token 700 of request 2 (position 2200: 18 causal blocks, reads 16) lists its first entry's block
    again as its second: the tile walks that page twice for that token's rows only."""
    t = int(case.args["cu_seqlens_q"][2]) + 700
    case.args["topk_idx"][:, t, 1] = case.args["topk_idx"][:, t, 0]


def _reference(case):
    """float64 on the GPU, before the slots past the end are poisoned (the reference reads whole pages)."""
    return cases.run_reference(case, dtype=torch.float64, on_device=True)


def _check(case, config, ref=None, **kw):
    ref = _reference(case) if ref is None else ref
    case.poison()
    cases.run_kernel(case, config=config, **kw)
    torch.cuda.synchronize()
    result = compare(case.output, ref, torch.bfloat16)
    assert result.ok, f"{case.scale_mode} {config.non_default()}: {result}"
    return result


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(SERVING_LAYOUTS))
@pytest.mark.parametrize("convert_rows", gpu_suite.PREFILL_WS_CONVERT_ROWS)
def test_ws_ragged(arch, mode, layout, convert_rows):
    """Ragged requests with prefixes (tiles shorter than block_t), junk ids inside the read entries and
    a stale tail after them, NaN past each request's end, one block listed twice by a token."""
    case = _case(arch, mode, layout, seed=convert_rows)
    _duplicate_listing(case)
    ref = _reference(case)
    case.poison_past_the_end()
    hq, hkv = SERVING_LAYOUTS[layout]
    _check(case, ws_config(gqa=hq // hkv, convert_rows=convert_rows), ref, selection="tiled")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["tp1", "tp8"])
def test_ws_correlated_auto(arch, mode, layout):
    """A serving-like correlated selection through selection='auto' (the device decides: the Gluon tile
    for tiles that share pages, the per-token walk otherwise), with a negative k_scale in scalar mode
    (folded into q's sign)."""
    case = _case(arch, mode, layout, q_lens=[640, 130, 900], prefix_lens=[0, 1000, 4000], pattern="correlated",
                 future_prob=0.0, tail="own", inner_junk=0.0, seed=5)
    if mode == "scalar":
        case.args["k_scale"].neg_()
    ref = _reference(case)
    case.poison_past_the_end()
    hq, hkv = SERVING_LAYOUTS[layout]
    config = ws_config(gqa=hq // hkv)
    call_plans.forget_plans()  # the call builds its plan inside the spy
    with cases.prefill_launch_offsets() as offsets:
        _check(case, config, ref, selection="auto")
    # Both paths are right, so which one ran is read off the per-token launch's offsets: zeros when the
    # Gluon tile's plan launch kept the call (shared pages), the call's own when it gave it away.
    assert torch.equal(offsets[1], torch.zeros_like(offsets[1])), \
        f"correlated selections went to the per-token walk: it read offsets {offsets[1].tolist()}"


@pytest.mark.parametrize("mode", MODES)
def test_ws_random_after_long_prefixes_goes_per_token(arch, mode):
    """The other side of the decision: selections scattered over long prefixes share few pages, so the
    Gluon tile's plan launch gives the call to the per-token walk (its launch reads the call's offsets)."""
    case = _case(arch, mode, "tp4", q_lens=[256, 64], prefix_lens=[60000, 3000], pattern="random", future_prob=0.0,
                 tail="own", inner_junk=0.0, seed=6)
    call_plans.forget_plans()
    with cases.prefill_launch_offsets() as offsets:
        _check(case, ws_config(gqa=16), selection="auto")
    assert torch.equal(offsets[1], case.args["cu_seqlens_q"]), \
        f"random selections after long prefixes stayed on the Gluon tile: the per-token walk read {offsets[1].tolist()}"


@pytest.mark.parametrize("mode", MODES)
def test_ws_bound_and_graph(arch, mode):
    """The second call of a shape runs the bound launches (its plan: new tensors, the TMA descriptor
    rebuilt for the new cache address); a CUDA graph captured on one input set replays on another."""
    config = ws_config(gqa=16)
    first = _case(arch, mode, "tp1", seed=11)
    call_plans.forget_plans()
    _check(first, config, selection="tiled")
    (built,) = call_plans.PLANS._plans.values()
    second = _case(arch, mode, "tp1", seed=12)  # same shapes, other tensors: the bound path
    ref = _reference(second)
    second.poison_past_the_end()
    _check(second, config, ref, selection="tiled")
    (reused,) = call_plans.PLANS._plans.values()
    assert reused is built, "the second call of the shape built a new plan instead of running the bound one"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cases.run_kernel(first, config=config, selection="tiled")
    first.refill_from(second)  # the poisoned tails too
    graph.replay()
    torch.cuda.synchronize()
    result = compare(first.output, ref, torch.bfloat16)
    assert result.ok, f"graph replay: {result}"


def test_ws_rejects_what_it_cannot_run(arch):
    """A given warp_specialize config the call cannot run raises, naming the field."""
    case = _case(arch, "scalar", "tp1")
    with pytest.raises(ValueError, match="config.warp_specialize"):
        cases.run_kernel(case, config=ws_config(gqa=16), fold_scales=False)  # the unfolded baseline
    with pytest.raises(ValueError, match="config.warp_specialize"):
        cases.run_kernel(case, config=ws_config(gqa=8))  # block_t 16 at GQA 16
    bf16 = cases.prefill_case(arch=arch, q_lens=[64], prefix_lens=[0], num_q_heads=64, num_kv_heads=4,
                              kv_dtype="bf16", scale_mode="none", q_dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="config.kv_upcast"):  # fp16 MMAs are for fp8 caches
        cases.run_kernel(bf16, config=ws_config(gqa=16))
