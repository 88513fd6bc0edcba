"""Accuracy gates: every generated (arch, kernel, scale mode) against the float64 reference, under
the Triton interpreter with fp32 queries (the interpreter's bf16 arithmetic is wrong, see
triton-lang/triton#11584; fp32 makes every operand exact so the gate can be tight)."""
import dataclasses

import pytest
import torch

from codegen import LaunchConfig, cases
from codegen.accuracy import compare, gate_dtype
from codegen.variants import ARCHS, PAGE_SIZE

# (scale mode, KV cache dtype): fp8 with each scale mode, fp8 without scales, and a bf16 cache.
MODES = [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "fp8"), ("none", "bf16")]
SMALL = dict(head_dim=32, topk=4)


def _config(arch, **kw):
    base = LaunchConfig(num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16) if ARCHS[arch].amd_knobs else LaunchConfig()
    return dataclasses.replace(base, **kw)


def _check(case, arch, config):
    case.poison()
    out = cases.run_kernel(case, arch=arch, config=config)
    assert out is case.output
    ref = cases.run_reference(case)
    result = compare(out, ref, gate_dtype(case.args["q"].dtype, config))
    assert result.ok, f"{arch} {case.kernel} {case.scale_mode}: {result}"
    return out, ref


PREFILL_SHAPES = {
    # ragged requests, with and without a cached prefix, GQA 4 padded to 16 rows
    "ragged_prefix": dict(q_lens=[3, 2, 1], prefix_lens=[300, 0, 517], num_q_heads=8, num_kv_heads=2),
    # a chunk crossing a page boundary inside the chunk (own block changes), GQA 16 (TP4-like)
    "cross_page": dict(q_lens=[4], prefix_lens=[126], num_q_heads=16, num_kv_heads=1),
    # neighbours sharing most blocks (what multi-token tiles exploit), a tile cut by the request end
    "correlated": dict(q_lens=[7, 5], prefix_lens=[600, 1000], num_q_heads=8, num_kv_heads=1, pattern="correlated"),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("shape", sorted(PREFILL_SHAPES))
@pytest.mark.parametrize("block_n,block_t", [(32, 1), (64, 1), (64, 2), (32, 4)])
def test_prefill(arch, mode, kv_dtype, shape, block_n, block_t):
    case = cases.prefill_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=block_n + block_t,
                              **PREFILL_SHAPES[shape], **SMALL)
    _check(case, arch, _config(arch, block_n=block_n, block_t=block_t))


DECODE_SHAPES = {
    "uniform_q1": dict(seq_lens=[700, 129, 2000], decode_query_len=1, num_q_heads=8, num_kv_heads=2),
    "uniform_spec_q4": dict(seq_lens=[1000, 260], decode_query_len=4, num_q_heads=8, num_kv_heads=2, padded_rows=2),
    "varlen_padded": dict(seq_lens=[300, 1000, 5, 0], varlen_q_lens=[2, 0, 1, 0], num_q_heads=16, num_kv_heads=1,
                          padded_rows=3),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("shape", sorted(DECODE_SHAPES))
@pytest.mark.parametrize("num_splits", [1, 3, 4])
def test_decode(arch, mode, kv_dtype, shape, num_splits):
    case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=num_splits,
                             **DECODE_SHAPES[shape], **SMALL)
    out, _ = _check(case, arch, _config(arch, block_n=64, num_splits=num_splits))
    real = case.args["q"].shape[0] - DECODE_SHAPES[shape].get("padded_rows", 0)
    assert torch.equal(out[real:], torch.zeros_like(out[real:])), "padded rows must come out as zeros"


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("shape", sorted(DECODE_SHAPES))
@pytest.mark.parametrize("kv_tma", [0, 1])
def test_decode_one_slice_programs(arch, mode, kv_dtype, shape, kv_tma):
    """A program of one page's single slice (block_n = the page, a split per top-k entry: the small
    batches' tuned configs), by TMA or plain loads, with the fused merge."""
    case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=11, **DECODE_SHAPES[shape], **SMALL)
    _check(case, arch, _config(arch, block_n=PAGE_SIZE, num_splits=SMALL["topk"], fused_merge=1, kv_tma=kv_tma))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("shape,variant", [
    # one slice a program, plain loads; many slices (partial ones), a merge kernel, TMA boxes on sm90
    ("uniform_spec_q4", dict(block_n=PAGE_SIZE, num_splits=SMALL["topk"], fused_merge=1, kv_tma=0)),
    ("varlen_padded", dict(block_n=32, num_splits=2, kv_tma=1)),
], ids=["one_slice", "slices"])
def test_decode_v_early(arch, mode, kv_dtype, shape, variant):
    """v_early 1: V and per_token_head's column scales loaded beside K (num_stages 1)."""
    case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=13, **DECODE_SHAPES[shape], **SMALL)
    _check(case, arch, _config(arch, num_stages=1, v_early=1, **variant))


@pytest.mark.parametrize("mode,kv_dtype", [("scalar", "fp8"), ("per_token_head", "fp8")])
@pytest.mark.parametrize("kv_upcast", [1, 3])
def test_decode_v_early_with_fp8_conversions(mode, kv_dtype, kv_upcast):
    """v_early with V through fp32 (1) or converted before its transpose (3, the interpreter's `.to()`)."""
    case = cases.decode_case(arch="sm90", kv_dtype=kv_dtype, scale_mode=mode, seed=17, **DECODE_SHAPES["uniform_q1"],
                             **SMALL)
    _check(case, "sm90", _config("sm90", block_n=32, num_stages=1, num_splits=2, fused_merge=1, kv_upcast=kv_upcast,
                                 v_early=1, kv_tma=0))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_full_head_dim_and_topk(arch, kernel):
    """The model's own head_dim 128 and topk 16 (fewer tokens to stay fast)."""
    if kernel == "prefill":
        case = cases.prefill_case(arch=arch, q_lens=[2], prefix_lens=[2100], num_q_heads=8, num_kv_heads=1, seed=7)
    else:
        case = cases.decode_case(arch=arch, seq_lens=[2300], decode_query_len=1, num_q_heads=8, num_kv_heads=1, seed=7)
    _check(case, arch, _config(arch, block_n=128, num_splits=1 if kernel == "prefill" else 2))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_contiguous_cache_and_default_config(arch, kernel):
    """A contiguous (head-major) cache and the arch's default config from the loader."""
    if kernel == "prefill":
        case = cases.prefill_case(arch=arch, q_lens=[2, 3], prefix_lens=[0, 140], num_q_heads=8, num_kv_heads=2,
                                  strided=False, seed=3, **SMALL)
    else:
        case = cases.decode_case(arch=arch, seq_lens=[500, 90], num_q_heads=8, num_kv_heads=2, strided=False,
                                 seed=3, **SMALL)
    _check(case, arch, None)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
@pytest.mark.parametrize("mode", ["scalar", "per_token_head"])
def test_dropped_or_swapped_scale_is_caught(arch, kernel, mode):
    """The gate is sharp enough: a result computed without a scale, or with K and V scales swapped,
    fails it. (A kernel that ignored a scale could not pass the tests above.)"""
    if kernel == "prefill":
        case = cases.prefill_case(arch=arch, scale_mode=mode, q_lens=[3], prefix_lens=[400], num_q_heads=8,
                                  num_kv_heads=2, seed=11, **SMALL)
    else:
        case = cases.decode_case(arch=arch, scale_mode=mode, seq_lens=[600, 300], num_q_heads=8, num_kv_heads=2,
                                 seed=11, **SMALL)
    out, ref = _check(case, arch, _config(arch))
    k_scale, v_scale = case.args["k_scale"], case.args["v_scale"]
    variants = {
        "no k_scale": dict(k_scale=torch.ones_like(k_scale)),
        "no v_scale": dict(v_scale=torch.ones_like(v_scale)),
        "swapped": dict(k_scale=v_scale, v_scale=k_scale),
    }
    for what, change in variants.items():
        wrong = cases.run_reference(dataclasses.replace(case, args=dict(case.args, **change)))
        assert not compare(out, wrong, torch.float32).ok, f"{what}: the gate cannot tell it from the right result"


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("block_t", [1, 4])
def test_prefill_negative_k_scale(arch, block_t):
    """Prefill takes row maxima of unscaled scores and applies the score scale in the exp2's FMA,
    which needs a scale >= 0: a negative scalar k_scale (folded into that scale) flips the query
    instead. Without that flip the maxima would be minima and the result wrong."""
    case = cases.prefill_case(arch=arch, kv_dtype="fp8", scale_mode="scalar", seed=71,
                              **PREFILL_SHAPES["correlated"], **SMALL)
    case.args["k_scale"].neg_()
    _check(case, arch, _config(arch, block_n=32, block_t=block_t))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_negative_k_scale(arch, num_splits):
    """Decode takes the same lean step as prefill's per-token walk (unscaled row maxima): a negative
    scalar k_scale must flip the query there too, split partials and their LSE included."""
    case = cases.decode_case(arch=arch, kv_dtype="fp8", scale_mode="scalar", seed=72, **DECODE_SHAPES["uniform_q1"],
                             **SMALL)
    case.args["k_scale"].neg_()
    _check(case, arch, _config(arch, block_n=32, num_splits=num_splits))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_unfolded_baseline(arch, kernel):
    """The seed's unfolded scalar rendering (the benchmark's baseline) computes the same function."""
    if kernel == "prefill":
        case = cases.prefill_case(arch=arch, q_lens=[3, 2], prefix_lens=[300, 0], num_q_heads=8, num_kv_heads=2,
                                  seed=5, **SMALL)
    else:
        case = cases.decode_case(arch=arch, seq_lens=[700, 129], num_q_heads=8, num_kv_heads=2, seed=5, **SMALL)
    for splits in ((1,) if kernel == "prefill" else (1, 3)):
        case.poison()
        out = cases.run_kernel(case, arch=arch, config=_config(arch, num_splits=splits), fold_scales=False)
        result = compare(out, cases.run_reference(case), torch.float32)
        assert result.ok, str(result)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("shape", sorted(DECODE_SHAPES))
def test_decode_fused_merge(arch, mode, kv_dtype, shape, monkeypatch):
    """One launch: the last split program of each (token, KV head) merges; its counter is zero
    again afterwards, so a second call (as a CUDA graph replay would) starts clean."""
    from codegen import api, plan

    plan.forget_plans()  # the call builds its plan here, with counters of its own (workspace.call_counters)
    made = []
    real = api.call_counters
    monkeypatch.setattr(api, "call_counters", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    config = _config(arch, block_n=32, num_splits=3, fused_merge=1)
    for seed in (11, 12):
        case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=seed,
                                 **DECODE_SHAPES[shape], **SMALL)
        out, _ = _check(case, arch, config)
        real = case.args["q"].shape[0] - DECODE_SHAPES[shape].get("padded_rows", 0)
        assert torch.equal(out[real:], torch.zeros_like(out[real:])), "padded rows must come out as zeros"
        (counters,) = made  # one plan, built by the first call and run by both
        assert int(counters.abs().sum()) == 0, "the fused merge must leave its arrival counters at zero"


FP8_MODES = [m for m in MODES if m[1] == "fp8"]


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,kv_dtype", FP8_MODES)
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
@pytest.mark.parametrize("kv_upcast", [1, 2])
def test_kv_upcast(arch, mode, kv_dtype, kernel, kv_upcast):
    """fp8 K/V through fp32 (exact: judged at fp32) or into fp16 MMAs (judged at fp16)."""
    if kernel == "prefill":
        case = cases.prefill_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=40 + kv_upcast,
                                  **PREFILL_SHAPES["correlated"], **SMALL)
        config = _config(arch, block_n=32, block_t=2, kv_upcast=kv_upcast)
    else:
        case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, seed=40 + kv_upcast,
                                 **DECODE_SHAPES["uniform_spec_q4"], **SMALL)
        config = _config(arch, block_n=64, num_splits=2, kv_upcast=kv_upcast)
    _check(case, arch, config)


@pytest.mark.parametrize("mode,kv_dtype", FP8_MODES)
@pytest.mark.parametrize("kernel,variant", [("decode", dict(num_splits=1)), ("decode", dict(num_splits=2, fused_merge=1)),
                                            ("prefill", dict(block_t=1)), ("prefill", dict(block_t=2))],
                         ids=["decode", "decode_fused", "prefill_per_token", "prefill_tiles"])
def test_v_converted_before_its_transpose(mode, kv_dtype, kernel, variant):
    """kv_upcast 3 (sm90): fp16 MMAs as 2, V through _e4m3_to_fp16, which the interpreter runs as
    `.to()` (the PTX path is checked by tests/static and on the GPU)."""
    if kernel == "prefill":
        case = cases.prefill_case(arch="sm90", kv_dtype=kv_dtype, scale_mode=mode, seed=47,
                                  **PREFILL_SHAPES["correlated"], **SMALL)
    else:
        case = cases.decode_case(arch="sm90", kv_dtype=kv_dtype, scale_mode=mode, seed=43,
                                 **DECODE_SHAPES["uniform_spec_q4"], **SMALL)
    _check(case, "sm90", _config("sm90", block_n=32, kv_upcast=3, **variant))


@pytest.mark.parametrize("kv_upcast", [2, 3])
@pytest.mark.parametrize("kernel,variant", [("decode", dict(num_splits=1)), ("decode", dict(num_splits=2, fused_merge=1)),
                                            ("prefill", dict(block_t=1)), ("prefill", dict(block_t=2))],
                         ids=["decode", "decode_fused", "prefill_per_token", "prefill_tiles"])
def test_unfolded_baseline_fp16_mmas(kernel, variant, kv_upcast):
    """The unfolded baseline with the fp16 MMAs the tuned tables pick (sm90): with kv_upcast 3 V is
    converted before the baseline's V scale (the interpreter runs `.to()` for the asm; tests/static
    compiles it)."""
    if kernel == "prefill":
        case = cases.prefill_case(arch="sm90", kv_dtype="fp8", scale_mode="scalar", seed=47,
                                  **PREFILL_SHAPES["correlated"], **SMALL)
    else:
        case = cases.decode_case(arch="sm90", kv_dtype="fp8", scale_mode="scalar", seed=43,
                                 **DECODE_SHAPES["uniform_spec_q4"], **SMALL)
    config = _config("sm90", block_n=32, kv_upcast=kv_upcast, **variant)
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=config, fold_scales=False)
    result = compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, config))
    assert result.ok, str(result)


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_kv_upcast_3_only_where_it_exists(kernel):
    """V's PTX conversion exists on sm90: on gfx942 kv_upcast 3 is refused by name."""
    make = cases.prefill_case if kernel == "prefill" else cases.decode_case
    shape = PREFILL_SHAPES["cross_page"] if kernel == "prefill" else DECODE_SHAPES["uniform_q1"]
    case = make(arch="gfx942", kv_dtype="fp8", scale_mode="scalar", seed=6, **shape, **SMALL)
    with pytest.raises(ValueError, match="config.kv_upcast: 3"):
        cases.run_kernel(case, arch="gfx942", config=_config("gfx942", kv_upcast=3))


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_fp16_mmas_keep_huge_queries_finite(kernel):
    """Queries far beyond fp16's range (1e6) are divided into it inside the kernel, and large
    per-token V scales do not overflow the fp16 probabilities."""
    arch = "sm90"
    make = cases.prefill_case if kernel == "prefill" else cases.decode_case
    shape = PREFILL_SHAPES["cross_page"] if kernel == "prefill" else DECODE_SHAPES["uniform_q1"]
    case = make(arch=arch, kv_dtype="fp8", scale_mode="per_token_head", seed=5, **shape, **SMALL)
    case.args["q"].mul_(1e6 / case.args["q"].abs().max())
    case.args["v_scale"].mul_(1e5)  # dequantized V up to ~4e7: P * v_scale would overflow fp16
    config = _config(arch, block_n=32, kv_upcast=2, **({"num_splits": 2} if kernel == "decode" else {}))
    case.poison()
    out = cases.run_kernel(case, arch=arch, config=config)
    ref = cases.run_reference(case)
    result = compare(out, ref, torch.float16)
    # Outputs are ~1e7 here: the absolute tolerance scales with them.
    assert result.unwritten == 0 and result.rel_l2 <= result.rel_tol, str(result)
    assert result.max_abs <= result.abs_tol * float(ref.abs().max()), str(result)


def test_kv_upcast_needs_an_fp8_cache():
    case = cases.decode_case(arch="sm90", kv_dtype="bf16", scale_mode="none", seed=3,
                             **DECODE_SHAPES["uniform_q1"], **SMALL)
    with pytest.raises(ValueError, match="config.kv_upcast"):
        cases.run_kernel(case, arch="sm90", config=_config("sm90", kv_upcast=2))


def test_a_grown_counter_buffer_keeps_the_old_one_alive():
    """A CUDA graph captured with the first (small) buffer replays into it after a larger call
    made a new one: the old buffer must never be freed."""
    import gc
    import weakref

    from codegen import workspace

    device = torch.device("cpu")
    first = workspace.arrival_counters(device, 10, key="test-grow")
    ref = weakref.ref(first)
    del first
    bigger = workspace.arrival_counters(device, 100_000, key="test-grow")
    gc.collect()
    assert ref() is not None and bigger.numel() >= 100_000
    assert workspace.arrival_counters(device, 50, key="test-grow") is bigger
