"""On sm90 the kernels read whole K/V slices through TMA boxes, slots no row sees included: whatever
those hold (NaN here) must not reach the output. A cache a TMA descriptor cannot address (a base
off 16 bytes) takes the plain-load path instead, with the same results. Small shapes, fp32 queries
and a bf16 cache (a bf16 NaN decodes as NaN in the interpreter; an fp8 one does not)."""
import dataclasses

import pytest
import torch

from codegen import LaunchConfig, cases
from codegen.accuracy import compare
from codegen.modules import load_module

SMALL = dict(head_dim=32, topk=4, num_q_heads=8, num_kv_heads=2, kv_dtype="bf16", scale_mode="none")
PATHS = {
    "decode_one_split": ("decode", LaunchConfig(block_n=64, num_splits=1)),
    "decode_fused_merge": ("decode", LaunchConfig(block_n=32, num_splits=3, fused_merge=1)),
    "prefill_per_token": ("prefill", LaunchConfig(block_n=64, block_t=1)),
    "prefill_tiles": ("prefill", LaunchConfig(block_n=32, block_t=4)),
}


def _case(kernel, seed=0):
    # Every request ends inside a page, so its last page has slots past the sequence.
    if kernel == "prefill":
        return cases.prefill_case(arch="sm90", q_lens=[9, 6], prefix_lens=[0, 250], seed=seed, **SMALL)
    return cases.decode_case(arch="sm90", seq_lens=[60, 200, 300, 700], seed=seed, **SMALL)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_nan_past_the_sequence_never_reaches_the_output(path):
    kernel, config = PATHS[path]
    case = _case(kernel)
    expected = cases.run_reference(case)
    module = load_module("sm90", "decode_split" if kernel == "decode" else "prefill", "none")
    assert module.kv_tma_ok(case.args["kv_cache"], 32)  # the TMA path is the one under test
    case.poison_past_the_end()
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=config)
    assert torch.isfinite(out).all()
    assert compare(out, expected, torch.float32).ok


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_a_cache_tma_cannot_address_takes_plain_loads(kernel):
    case = _case(kernel, seed=1)
    kv = case.args["kv_cache"]
    # The same values one bf16 element past a 16-byte boundary: no TMA descriptor for this base.
    shifted = torch.empty(kv.numel() + 1, dtype=kv.dtype)[1:].view(kv.shape)
    shifted.copy_(kv)
    module = load_module("sm90", "decode_split" if kernel == "decode" else "prefill", "none")
    assert module.kv_tma_ok(kv, 32) and not module.kv_tma_ok(shifted, 32)
    expected = cases.run_reference(case)
    case.args["kv_cache"] = shifted
    case.poison()
    config = PATHS["decode_fused_merge" if kernel == "decode" else "prefill_tiles"][1]
    out = cases.run_kernel(case, arch="sm90", config=config)
    assert compare(out, expected, torch.float32).ok


@pytest.mark.parametrize("path", sorted(PATHS))
def test_kv_tma_0_takes_plain_loads_with_the_same_results(path, monkeypatch):
    import dataclasses

    import triton.tools.tensor_descriptor as td

    kernel, config = PATHS[path]
    case = _case(kernel, seed=2)
    expected = cases.run_reference(case)
    built = []
    real = td.TensorDescriptor.__init__

    def spy(self, *args, **kw):  # every descriptor a launch builds
        built.append(args)
        real(self, *args, **kw)

    monkeypatch.setattr(td.TensorDescriptor, "__init__", spy)
    results = {}
    for kv_tma in (1, 0):
        built.clear()
        case.poison()
        results[kv_tma] = cases.run_kernel(case, arch="sm90", config=dataclasses.replace(config, kv_tma=kv_tma)).clone()
        assert bool(built) == bool(kv_tma), f"kv_tma={kv_tma}: {len(built)} descriptors built"
        assert compare(results[kv_tma], expected, torch.float32).ok
    assert torch.allclose(results[0], results[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale_mode", ["scalar", "per_token_head"])
@pytest.mark.parametrize("view", ["row_padded", "base_off_16"])
def test_kv_upcast_3_converts_unaligned_rows_by_to(scale_mode, view):
    """Issue 35: the asm conversions with a per-key operand need a key's fp8 values packed together,
    which Triton's loads give only on 16-byte-aligned rows (tests/static/test_cvt_layout.py). An fp8
    cache view Triton cannot see aligned (a [pages, Hkv, 128, 2D + 8] buffer's [..., :2D], or a base
    off 16 bytes) launches with V_CVT_ASM off; an aligned one with it on. Same results (the
    interpreter takes `.to()` either way: the GPU tests check the compiled paths)."""
    case = cases.prefill_case(arch="sm90", q_lens=[9, 6], prefix_lens=[0, 250], seed=3,
                              **{**SMALL, "kv_dtype": "fp8", "scale_mode": scale_mode})
    kv = case.args["kv_cache"]
    pages, hkv, page, width = kv.shape
    if view == "row_padded":
        unaligned = torch.empty(pages, hkv, page, width + 8, dtype=kv.dtype)[..., :width]
    else:
        unaligned = torch.empty(kv.numel() + 16 + 1, dtype=kv.dtype)[1:1 + kv.numel()].view(kv.shape)
    unaligned.copy_(kv)
    module = load_module("sm90", "prefill", scale_mode)
    assert module.kv_rows_aligned(kv) and not module.kv_rows_aligned(unaligned)
    config = LaunchConfig(block_n=64, block_t=1, kv_upcast=3)
    expected = cases.run_reference(case)
    for cache, asm in ((kv, True), (unaligned, False)):
        case.args["kv_cache"] = cache
        recorded = []
        args = case.args
        module.launch(args["q"], cache, args["topk_idx"], args["block_table"], args["cu_seqlens_q"],
                      args["seq_lens"], args["prefix_lens"], args["max_query_len"], args["num_kv_heads"],
                      args["sm_scale"], args["output"], args.get("k_scale"), args.get("v_scale"), config,
                      record=recorded)
        assert recorded[0][3]["V_CVT_ASM"] is asm and recorded[0][3]["KV_UPCAST"] == 2
        case.poison()
        out = cases.run_kernel(case, arch="sm90", config=config, selection="per_token")
        assert compare(out, expected, torch.float16).ok


def test_uniform_multi_token_plain_loads_mask_every_slice():
    """Uniform multi-token decode on plain loads masks every slice's scores (MASK_ALL_SLICES; why:
    tests/static/test_multi_token_decode.py) unless V converts by asm (kv_upcast 3: the gate was
    faster there, results/h100/decode-multitoken-check); single-token, varlen and TMA launches keep
    the gate."""
    module = load_module("sm90", "decode_split", "none")
    config = LaunchConfig(block_n=32, num_splits=3, fused_merge=1, kv_tma=0)
    shape = dict(num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4, config=config)
    assert module.constexprs(**shape, decode_query_len=3)["MASK_ALL_SLICES"] is True
    assert module.constexprs(**shape, decode_query_len=1)["MASK_ALL_SLICES"] is False
    assert module.constexprs(**shape, decode_query_len=3, kv_tma=True)["MASK_ALL_SLICES"] is False
    assert module.constexprs(**shape, decode_query_len=3, varlen=True)["MASK_ALL_SLICES"] is False
    asm_v = dataclasses.replace(config, kv_upcast=3)
    assert load_module("sm90", "decode_split", "scalar").constexprs(
        **dict(shape, config=asm_v), decode_query_len=3)["MASK_ALL_SLICES"] is False
    # Three tokens a request: all but the last end inside their own block, a partial slice each.
    case = cases.decode_case(arch="sm90", seq_lens=[60, 200, 300], decode_query_len=3, seed=2, **SMALL)
    expected = cases.run_reference(case)
    case.poison_past_the_end()
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=config)
    assert torch.isfinite(out).all()
    assert compare(out, expected, torch.float32).ok
