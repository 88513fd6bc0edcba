"""Oracles that share no decision with the runtime (issue 39).

The accuracy and contract tests compare the kernels with codegen.reference; a rule that the
reference, the kernels and the input builders took from one place could move in all of them at
once and still agree. Here the contract's read count (a token at position p reads the first
min(topk, p // 128 + 1) entries of its row) and the scale mode come from this file alone:
- hand-written rows at positions 127, 128 and 129, whose junk tails would change the result if
  read, against plain causal attention written out below (no read count at all);
- the inputs codegen.cases builds, at the same page boundary;
- the reference's scale mode, with validate's helper (the API's) made to lie;
- the module variant the API launches for each scale mode.
"""
import pytest
import torch

from codegen import LaunchConfig, cases, reference, sparse_attn_decode, sparse_attn_prefill, validate

PAGE = 128
TOPK = 3
# position -> (its hand-written row, what it sees). The first n = min(3, p // 128 + 1) entries are
# read; what follows them would change the output if it were read too:
# - 127 (n = 1): the only read entry is -1, so the token sees nothing and comes out as zeros;
#   block 0 in its tail would give it keys.
# - 128 (n = 2): blocks 1 and 0, every key 0..128 once; block 0 again in the tail would weigh
#   keys 0..127 twice against key 128 (a missed entry would drop keys).
# - 129 (n = 2): blocks 0 and 1; block 1 again would weigh keys 128, 129 twice.
ROWS = {127: ([-1, 0, 0], "nothing"), 128: ([1, 0, 0], "keys 0..p"), 129: ([0, 1, 1], "keys 0..p")}
POSITIONS = sorted(ROWS)
MODES = [("none", "bf16"), ("scalar", "fp8")]


def _rows() -> torch.Tensor:
    return torch.tensor([[ROWS[p][0] for p in POSITIONS]], dtype=torch.int32)  # [Hkv=1, 3 tokens, topk]


def _prefill(arch, mode, kv_dtype):
    """One request: three tokens after a prefix of 127, at positions 127, 128 and 129."""
    case = cases.prefill_case(arch=arch, q_lens=[3], prefix_lens=[POSITIONS[0]], num_q_heads=2, num_kv_heads=1,
                              head_dim=16, topk=TOPK, kv_dtype=kv_dtype, scale_mode=mode, future_prob=0.0, seed=3)
    case.args["topk_idx"] = _rows()
    return case, [(t, 0, p) for t, p in enumerate(POSITIONS)]


def _decode(arch, mode, kv_dtype):
    """Three requests of 128, 129 and 130 keys, one new token each: positions 127, 128 and 129."""
    case = cases.decode_case(arch=arch, seq_lens=[p + 1 for p in POSITIONS], num_q_heads=2, num_kv_heads=1,
                             head_dim=16, topk=TOPK, kv_dtype=kv_dtype, scale_mode=mode, seed=3)
    case.args["topk_idx"] = _rows()
    return case, [(r, r, p) for r, p in enumerate(POSITIONS)]


def _causal_attention(args, t: int, req: int, p: int) -> torch.Tensor:
    """Token t of request `req`, at position p, attending to every key 0..p of its request once:
    softmax(q K^T * sm_scale) V in float64, K and V read through the block table, scaled."""
    q, cache, table = args["q"], args["kv_cache"], args["block_table"]
    head_dim = q.shape[2]
    pages = table[req, : p // PAGE + 1].tolist()
    kv = torch.cat([cache[page, 0].double() for page in pages])[: p + 1]  # [p + 1, 2D] (one KV head)
    k, v = kv[:, :head_dim], kv[:, head_dim:]
    if args["k_scale"] is not None:  # scalar mode
        k, v = k * args["k_scale"].item(), v * args["v_scale"].item()
    scores = q[t].double() @ k.T * args["sm_scale"]  # [Hq, p + 1]
    return torch.softmax(scores, dim=-1) @ v


def _expected(case, tokens) -> torch.Tensor:
    out = torch.zeros(case.output.shape, dtype=torch.float64)
    for t, req, p in tokens:
        if ROWS[p][1] == "keys 0..p":
            out[t] = _causal_attention(case.args, t, req, p)
    return out


def _check(out, expected, tokens, what):
    for t, _, p in tokens:
        torch.testing.assert_close(out[t].double(), expected[t], rtol=1e-5, atol=1e-4,
                                   msg=lambda m: f"{what}, position {p} (row {ROWS[p][0]}): {m}")


def _config(arch, **kw):
    amd = dict(num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16) if arch == "gfx942" else {}
    return LaunchConfig(**amd, **kw)


PATHS = {  # prefill's per-token walk and tiles (one tile of all three tokens); decode's splits
    "prefill_per_token": (_prefill, dict(block_n=32, block_t=1)),
    "prefill_tile_2": (_prefill, dict(block_n=32, block_t=2)),
    "prefill_tile_4": (_prefill, dict(block_n=32, block_t=4)),
    "decode_one_split": (_decode, dict(block_n=64, num_splits=1)),
    "decode_split_merge": (_decode, dict(block_n=64, num_splits=2)),
    "decode_fused_merge": (_decode, dict(block_n=64, num_splits=3, fused_merge=1)),
}
ARCH_MODES = [("sm90", mode, kv) for mode, kv in MODES] + [("gfx942", "scalar", "fp8")]


@pytest.mark.parametrize("arch, mode, kv_dtype", ARCH_MODES)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_kernels_read_exactly_the_contract_s_entries_at_the_page_boundary(path, arch, mode, kv_dtype):
    make, config = PATHS[path]
    case, tokens = make(arch, mode, kv_dtype)
    case.poison()
    out = cases.run_kernel(case, arch=arch, config=_config(arch, **config))
    _check(out, _expected(case, tokens), tokens, f"{arch} {path} {mode}")


@pytest.mark.parametrize("make", [_prefill, _decode])
@pytest.mark.parametrize("mode, kv_dtype", MODES)
def test_the_reference_reads_exactly_the_contract_s_entries_at_the_page_boundary(make, mode, kv_dtype):
    case, tokens = make("sm90", mode, kv_dtype)
    _check(cases.run_reference(case), _expected(case, tokens), tokens, f"reference {make.__name__} {mode}")
    batched = cases.run_reference(case, on_device=True)  # the tuner's and the GPU tests' reference
    _check(batched, _expected(case, tokens), tokens, f"batched reference {make.__name__} {mode}")


def test_cases_fill_exactly_the_entries_past_the_contract_s_count():
    """cases builds its rows with its own count: at 127 one entry is read, at 128 and 129 two; the
    tail repeats the own block (vLLM's fill), where a row with too few picks would hold -1."""
    case = cases.prefill_case(arch="sm90", q_lens=[3], prefix_lens=[127], num_q_heads=2, num_kv_heads=1,
                              head_dim=16, topk=TOPK, tail="own", future_prob=0.0, seed=1)
    rows = case.args["topk_idx"][0].tolist()
    assert rows[0] == [0, 0, 0], rows
    assert sorted(rows[1][:2]) == sorted(rows[2][:2]) == [0, 1] and rows[1][2] == rows[2][2] == 1, rows


def _dequantized(args) -> torch.Tensor:
    """The cache in float64 with its scales applied, for a reference call without scales."""
    kv = args["kv_cache"].double().clone()
    num_blocks, num_kv_heads, _, width = kv.shape

    def per_slot(scale):  # one element, or [Hkv, >= num_blocks * 128] by physical slot
        if scale.numel() == 1:
            return scale.double().reshape(())
        return scale[:, : num_blocks * PAGE].double().reshape(num_kv_heads, num_blocks, PAGE).permute(1, 0, 2)[..., None]

    kv[..., : width // 2] *= per_slot(args["k_scale"])
    kv[..., width // 2:] *= per_slot(args["v_scale"])
    return kv


@pytest.mark.parametrize("mode", ["scalar", "per_token_head"])
def test_the_reference_reads_the_scale_mode_off_the_scales_itself(monkeypatch, mode):
    """validate.scale_mode_of picks the API's kernel; made to answer "none" (as a broken helper
    would), the reference must still scale."""
    case = cases.decode_case(arch="sm90", seq_lens=[300, 700], num_q_heads=4, num_kv_heads=2, head_dim=16, topk=4,
                             scale_mode=mode, seed=2)
    monkeypatch.setattr(validate, "scale_mode_of", lambda *args: "none")
    scaled = cases.run_reference(case)
    plain = reference.reference_decode(**dict(case.args, output=None, kv_cache=_dequantized(case.args), k_scale=None,
                                              v_scale=None))
    torch.testing.assert_close(scaled, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
@pytest.mark.parametrize("mode, kv_dtype", [("none", "bf16"), ("none", "fp8"), ("scalar", "fp8"),
                                            ("per_token_head", "fp8")])
def test_the_api_launches_the_variant_of_each_scale_mode(launches, arch, mode, kv_dtype):
    """Which generated module runs, by the contract's table: no scales `none`, one element each
    `scalar`, [Hkv, N] each `per_token_head`; fold_scales=False the unfolded scalar baseline."""
    small = dict(arch=arch, num_q_heads=4, num_kv_heads=2, head_dim=16, topk=4, kv_dtype=kv_dtype, scale_mode=mode)
    decode = cases.decode_case(seq_lens=[300], **small)
    sparse_attn_decode(**decode.args, arch=arch, config=_config(arch, block_n=64, num_splits=2))
    prefill = cases.prefill_case(q_lens=[2], prefix_lens=[130], **small)
    sparse_attn_prefill(**prefill.args, arch=arch, config=_config(arch, block_n=32, block_t=2))
    assert launches == [f"{arch}_decode_split_{mode}", f"{arch}_decode_merge_{mode}", f"{arch}_prefill_{mode}"]
    if mode == "scalar":
        launches.clear()
        sparse_attn_decode(**decode.args, arch=arch, config=_config(arch, block_n=64, num_splits=2), fold_scales=False)
        assert launches == [f"{arch}_decode_split_scalar_unfolded", f"{arch}_decode_merge_scalar_unfolded"]
