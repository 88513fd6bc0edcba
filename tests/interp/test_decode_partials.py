"""Decode split-K partials: fp16 where that is range-safe, fp32 elsewhere (the split kernel's
`partial_dtype`), and both merges (the merge kernel and the split kernel's fused merge) reading
whatever the buffer holds.

fp16 partials are taken for folded scalar scales on an fp8 cache with a 16-bit output: a partial is
then a convex combination of unscaled fp8 V values (|o| <= 448), V's scale comes after the merge.
Runs with fp16 queries where fp16 partials are meant to be exercised (the interpreter's bf16
arithmetic is wrong, see tests/interp/test_accuracy.py), judged at fp16's tolerance."""
import dataclasses

import pytest
import torch

from codegen import LaunchConfig, cases, workspace
from codegen.accuracy import compare
from codegen.modules import load_module
from codegen.shapes import torch_dtype
from codegen.variants import ARCHS

SMALL = dict(head_dim=32, topk=4)
SHAPE = dict(seq_lens=[600, 129], decode_query_len=1, num_q_heads=8, num_kv_heads=2)

# (scale mode, fold_scales, KV cache dtype, output dtype) -> the partials' dtype
EXPECTED = [
    ("scalar", True, "fp8", torch.float16, torch.float16),
    ("scalar", True, "fp8", torch.bfloat16, torch.float16),
    ("scalar", True, "fp8", torch.float32, torch.float32),  # an fp32 output keeps fp32 precision
    ("scalar", False, "fp8", torch.float16, torch.float32),  # unfolded: V scaled inside the loop
    ("per_token_head", True, "fp8", torch.float16, torch.float32),  # per-token V scales inside the loop
    ("none", True, "fp8", torch.float16, torch.float32),
    ("none", True, "bf16", torch.bfloat16, torch.float32),  # a bf16 V can exceed fp16's range
    ("none", True, "fp16", torch.float16, torch.float32),
]


def _config(arch, **kw):
    base = LaunchConfig(num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16) if ARCHS[arch].amd_knobs else LaunchConfig()
    return dataclasses.replace(base, **kw)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,fold,kv_dtype,out_dtype,expected", EXPECTED)
def test_partial_dtype_rule(arch, mode, fold, kv_dtype, out_dtype, expected):
    split = load_module(arch, "decode_split", mode, fold)
    assert split.partial_dtype(torch_dtype(arch, kv_dtype), out_dtype) == expected


def _split_launch(case, arch, config, fold=True):
    """The split module's own launch (no codegen.api): returns its partial buffers (or None)."""
    a = case.args
    counters = workspace.arrival_counters(a["q"].device, a["q"].shape[0] * a["num_kv_heads"]) \
        if config.fuses_merge else None
    return load_module(arch, "decode_split", case.scale_mode, fold).launch(
        a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"],
        a["output"], a["decode_query_len"], a["k_scale"], a["v_scale"], a["query_start_loc"],
        a["token_to_req_indices"], config, False, counters)


def _merge_launch(case, arch, parts, config, fold=True):
    a = case.args
    return load_module(arch, "decode_merge", case.scale_mode, fold).launch(
        parts[0], parts[1], a["output"], a["num_kv_heads"], a["v_scale"], config, False)


def _ok(case, out, gate):
    ref = cases.run_reference(case)
    result = compare(out, ref, gate)
    assert result.ok, f"{case.scale_mode}: {result}"
    return ref


# (scale mode, fold_scales, KV dtype, query/output dtype, partials' dtype)
LAUNCHES = [
    ("scalar", True, "fp8", torch.float16, torch.float16),
    ("scalar", True, "fp8", torch.float32, torch.float32),
    ("scalar", False, "fp8", torch.float16, torch.float32),
    ("per_token_head", True, "fp8", torch.float16, torch.float32),
    ("none", True, "bf16", torch.float32, torch.float32),
]


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("mode,fold,kv_dtype,q_dtype,expected", LAUNCHES)
def test_launch_allocates_and_merges_the_partials(arch, mode, fold, kv_dtype, q_dtype, expected):
    """The split launch allocates partials of the expected dtype (lse fp32); the merge kernel
    reduces them and the fused merge computes the same result, both within the gate."""
    case = cases.decode_case(arch=arch, kv_dtype=kv_dtype, scale_mode=mode, q_dtype=q_dtype, seed=21, **SHAPE,
                             **SMALL)
    unfused = _config(arch, block_n=32, num_splits=3)
    case.poison()
    parts = _split_launch(case, arch, unfused, fold)
    assert parts is not None
    part_o, part_lse = parts
    assert part_o.dtype == expected and part_lse.dtype == torch.float32
    assert part_o.shape == (case.args["q"].shape[0], SHAPE["num_q_heads"], 3, SMALL["head_dim"])
    assert bool(torch.isfinite(part_o.float()).all())
    _merge_launch(case, arch, parts, unfused, fold)
    merged = case.output.clone()
    ref = _ok(case, merged, q_dtype)

    case.poison()
    assert _split_launch(case, arch, _config(arch, block_n=32, num_splits=3, fused_merge=1), fold) is None
    _ok(case, case.output, q_dtype)
    # Same partials, same merge code: the two merges agree far below the gate.
    assert float((case.output.double() - merged.double()).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("num_splits,fused_merge", [(3, 0), (4, 1)])
def test_fp16_partials_against_one_split(arch, num_splits, fused_merge):
    """Scalar fp8, fp16 queries: through the api, fp16 partials merged (fused or not) land within
    the fp16 gate and within a few fp16 ulps of the one-split result (which never writes partials)."""
    case = cases.decode_case(arch=arch, kv_dtype="fp8", scale_mode="scalar", q_dtype=torch.float16,
                             seed=30 + num_splits, num_q_heads=16, num_kv_heads=1, seq_lens=[1500, 300],
                             **SMALL)
    case.poison()
    one = cases.run_kernel(case, arch=arch, config=_config(arch, block_n=64, num_splits=1)).clone()
    case.poison()
    out = cases.run_kernel(case, arch=arch, config=_config(arch, block_n=64, num_splits=num_splits,
                                                          fused_merge=fused_merge))
    ref = _ok(case, out, torch.float16)
    # fp16's ulp at the largest output, a few of them: the partials' rounding plus the output's.
    ulp = 2.0 ** (torch.frexp(ref.abs().max().float()).exponent.item() - 11)
    assert float((out.double() - one.double()).abs().max()) <= 4 * ulp


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("fused_merge", [0, 1])
@pytest.mark.parametrize("signs", ["positive", "mixed"])
def test_fp16_partials_at_the_largest_fp8_values(arch, fused_merge, signs):
    """Every V element at the fp8 type's largest magnitude (448 e4m3fn, 240 e4m3fnuz): the unscaled
    partials reach it and stay finite in fp16; the merged output is accurate."""
    case = cases.decode_case(arch=arch, kv_dtype="fp8", scale_mode="scalar", q_dtype=torch.float16, seed=50,
                             **SHAPE, **SMALL)
    kv = case.args["kv_cache"]
    d = SMALL["head_dim"]
    top = torch.finfo(kv.dtype).max
    values = torch.full(kv[..., d:].shape, top)
    if signs == "mixed":
        gen = torch.Generator().manual_seed(5)
        values = torch.where(torch.rand(values.shape, generator=gen) < 0.7, values, -values)
    kv[..., d:] = values.to(kv.dtype)
    config = _config(arch, block_n=32, num_splits=3, fused_merge=fused_merge)
    case.poison()
    parts = _split_launch(case, arch, config)
    if fused_merge:
        assert parts is None
    else:
        part_o, _ = parts
        assert part_o.dtype == torch.float16
        real = part_o.float()
        assert bool(torch.isfinite(real).all())
        if signs == "positive":  # rows that saw keys hold V's value itself; empty splits hold zeros
            assert float(real.abs().max()) == pytest.approx(top, rel=2 ** -10)
        _merge_launch(case, arch, parts, config)
    out = case.output
    ref = cases.run_reference(case)
    result = compare(out, ref, torch.float16)
    # Outputs are up to ~450 here: the absolute tolerance scales with them.
    assert result.unwritten == 0 and result.rel_l2 <= result.rel_tol, str(result)
    assert result.max_abs <= result.abs_tol * float(ref.abs().max()), str(result)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_kernels_store_and_load_the_buffers_own_type(monkeypatch, arch):
    """With fp32 queries (fp32 partials), forcing fp16 partials gives exactly the fp32 partials
    rounded to fp16, the same lse, and merges (unfused and fused) within fp16's rounding."""
    case = cases.decode_case(arch=arch, kv_dtype="fp8", scale_mode="scalar", seed=61, **SHAPE, **SMALL)
    split = load_module(arch, "decode_split", "scalar")
    config = _config(arch, block_n=32, num_splits=4)
    case.poison()
    o32, lse32 = _split_launch(case, arch, config)
    assert o32.dtype == torch.float32
    monkeypatch.setattr(split, "partial_dtype", lambda kv_dtype, out_dtype: torch.float16)
    case.poison()
    o16, lse16 = _split_launch(case, arch, config)
    assert o16.dtype == torch.float16
    assert torch.equal(o16, o32.to(torch.float16))
    assert torch.equal(lse16, lse32)
    _merge_launch(case, arch, (o16, lse16), config)
    merged = case.output.clone()
    _ok(case, merged, torch.float16)
    case.poison()
    assert _split_launch(case, arch, dataclasses.replace(config, fused_merge=1)) is None
    _ok(case, case.output, torch.float16)
    assert float((case.output - merged).abs().max()) <= 1e-6 * float(merged.abs().max())
