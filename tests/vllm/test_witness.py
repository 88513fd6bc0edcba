"""vLLM as a witness (issue 39, item 6): vLLM 0.33.0's own MiniMax-M3 Triton kernels and msa-tune's
API computing the same calls on the same tensors, under the Triton interpreter.

vLLM's side is its unpatched functions (common/ops/sparse_attn.py; on gfx942 the prefill of
amd/ops/sparse_attn.py), given the views MiniMaxM3SparseTritonImpl.forward passes: one step's
decode tokens first, then its prefill tokens, in one q / output buffer; the top-k buffer
transposed on CUDA and sliced; the block table's rows sliced; scales as 0-d fp32 tensors (the
layer's _k_scale / _v_scale) or per token and head. msa-tune's side is sparse_attn_prefill /
sparse_attn_decode with arch= set. The inputs are built here, with the contract's read count
written out on its own (issue 39, item 1), not taken from codegen.cases.

Agreement, where the contract says the two compute the same thing (test_*_agree*):
- fp8 e4m3fn caches with fp32 queries: rtol = atol = 1e-5 elementwise. Every operand is exact in
  fp32 (fp8 values upcast exactly, a scale product is one fp32 rounding), so both kernels land
  within about 1e-6 of the float64 reference and of each other (measured 2e-7); the margin covers
  the summation order. A wrong key, mask or scale moves outputs by more than 1e-2.
- fp16 caches need fp16 queries here (vLLM's tl.dot takes q and the cache in one dtype, and the
  interpreter refuses bf16): rtol = atol = 2e-3, two fp16 units in the last place at |x| ~ 1, as
  the two round the probabilities, decode's partials and the output to fp16 at different points
  (measured 2e-4).

Differences by design, each a test_difference_* test with its reason: vLLM's prefill uses ids
inside a token's first n entries unchecked (-1 reads the entry before its block-table row), its
block offset blk * 128 wraps in int32 from id 2^24 on, its decode leaves padded (zero-length)
rows NaN, and its ROCm prefill reads as many entries as a row has non-negative ids (it needs -1
tails). In each, msa-tune's output is the contract's reference.

Not witnessed: gfx942's fp8 (e4m3fnuz). Triton 3.6's interpreter cannot load it ("fail to convert
fp8e4b8"), neither in vLLM's kernels nor in msa-tune's; Triton 3.9's can, but vLLM's decode
kernel does not run there (test_fnuz_cache_cannot_run_here says so). bf16 caches: bf16 queries.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import types

import pytest
import torch

if importlib.util.find_spec("vllm") is None:  # find_spec: importing vLLM here would cost seconds
    pytest.skip("vLLM is installed in .venv-vllm only (scripts/setup_vllm.sh)", allow_module_level=True)

PKG = "vllm.models.minimax_m3"
BLOCK = 128
HQ, HKV, D, TOPK = 8, 2, 32, 4
SM_SCALE = D ** -0.5
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}
INT32_MAX = 2 ** 31 - 1
FIRST_WRAPPING_ID = 2 ** 24  # 2^24 * 128 = 2^31: the first block id whose offset wraps in int32

# Decode requests (keys, the new tokens included) and prefill requests (prefix, new tokens) of the
# steps: positions 126-130 around a block edge, n from 1 to topk, a fresh prompt. Few tokens: the
# interpreter runs each program's loop in Python.
DECODE_SEQ_LENS = [130, 385]
PREFILL_REQUESTS = [(0, 1), (126, 4), (380, 2), (520, 1)]

# Triton 3.6's interpreter indexes with 1-element arrays, which NumPy 2.3 warns about on every load.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@dataclasses.dataclass
class VllmKernels:
    """vLLM's functions as its model code reaches them, per arch (gfx942: ROCm prefill)."""
    prefill: dict
    decode: dict


@pytest.fixture(scope="module")
def vllm_kernels() -> VllmKernels:
    common, amd = import_vllm_ops()
    for fn in (common.minimax_m3_sparse_attn, common.minimax_m3_sparse_attn_decode, amd.minimax_m3_sparse_attn):
        assert fn.__module__.startswith(PKG) and not hasattr(fn, "vllm_original"), f"not vLLM's own: {fn!r}"
    return VllmKernels(prefill={"sm90": common.minimax_m3_sparse_attn, "gfx942": amd.minimax_m3_sparse_attn},
                       decode={"sm90": common.minimax_m3_sparse_attn_decode,
                               "gfx942": amd.minimax_m3_sparse_attn_decode})


def import_vllm_ops():
    """vLLM's two kernel modules, with real Triton (under the interpreter conftest.py turned on)."""
    # The package and vllm.platforms.rocm stand in for import only, as in scenarios.py (see its
    # docstring): the package __init__ needs torchvision, the real rocm module a ROCm GPU.
    if PKG not in sys.modules:
        sys.modules[PKG] = importlib.util.module_from_spec(importlib.util.find_spec(PKG))
    if "vllm.platforms.rocm" not in sys.modules:
        rocm = types.ModuleType("vllm.platforms.rocm")
        rocm.on_gfx950 = rocm.on_mi3xx = lambda: False  # gfx942's sub-tile width, no MI3xx launch options
        sys.modules["vllm.platforms.rocm"] = rocm
    # vLLM swaps Triton for a placeholder unless exactly one GPU driver is active, except while
    # CUDA_VISIBLE_DEVICES is empty (a distributed worker starting up): that branch keeps Triton.
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        from vllm.triton_utils import HAS_TRITON

        common = importlib.import_module(f"{PKG}.common.ops.sparse_attn")
        amd = importlib.import_module(f"{PKG}.amd.ops.sparse_attn")
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    assert HAS_TRITON, "vllm.triton_utils was imported earlier in this process with Triton disabled"
    return common, amd


# ---------------------------------------------------------------------------------------------
# Inputs: one forward step, built as vLLM lays it out.
# ---------------------------------------------------------------------------------------------
def entries_read(p: int) -> int:
    """The contract's read count for a token at position p: min(topk, p // 128 + 1); none before 0."""
    return 0 if p < 0 else min(TOPK, p // BLOCK + 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass
class Step:
    """One forward step's tensors; the *_args methods slice them as vLLM's forward does."""
    arch: str
    q: torch.Tensor  # [num_tokens, HQ, D]: decode tokens, then prefill tokens
    kv_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    topk: torch.Tensor  # [HKV, num_tokens, TOPK], a view of the layout's buffer
    block_table: torch.Tensor  # [num_reqs, width]: decode requests' rows first
    rows: list  # per token: (request, position)
    num_decodes: int
    decode_query_len: int
    seq_lens: list  # per request

    @property
    def nd(self) -> int:  # decode tokens
        return self.num_decodes * self.decode_query_len

    def decode_args(self, output: torch.Tensor) -> tuple:
        """sparse_attn_decode's positional arguments, sliced as the model's forward slices them."""
        nd, n = self.nd, self.num_decodes
        seq_lens = torch.tensor(self.seq_lens[:n], dtype=torch.int32)
        return (self.q[:nd], self.kv_cache, self.topk[:, :nd, :], self.block_table[:n], seq_lens, HKV, SM_SCALE,
                output[:nd], self.decode_query_len)

    def prefill_args(self, output: torch.Tensor) -> tuple:
        nd, n = self.nd, self.num_decodes
        reqs = range(n, len(self.seq_lens))
        q_lens = [sum(1 for r, _ in self.rows if r == req) for req in reqs]
        cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        seq_lens = torch.tensor(self.seq_lens[n:], dtype=torch.int32)
        prefix_lens = seq_lens - torch.tensor(q_lens, dtype=torch.int32)
        return (self.q[nd:], self.kv_cache, self.topk[:, nd:, :], self.block_table[n:], cu, seq_lens, prefix_lens,
                max(q_lens), HKV, SM_SCALE, output[nd:])

    def scales(self) -> dict:
        return dict(k_scale=self.k_scale, v_scale=self.v_scale)

    def poisoned_output(self) -> torch.Tensor:
        return torch.full(self.q.shape, float("nan"), dtype=self.q.dtype)


def make_step(*, decode_seq_lens=(), decode_query_len=1, prefill=(), kv_dtype=torch.float8_e4m3fn,
              scale_mode="scalar", q_dtype=torch.float32, arch="sm90", layout="cuda", tail="own",
              table_width=None, seed=0) -> Step:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = list(decode_seq_lens) + [prefix + n for prefix, n in prefill]
    rows = [(r, s - decode_query_len + j) for r, s in enumerate(decode_seq_lens) for j in range(decode_query_len)]
    rows += [(len(decode_seq_lens) + i, prefix + j) for i, (prefix, n) in enumerate(prefill) for j in range(n)]
    blocks = [max(1, cdiv(s, BLOCK)) for s in seq_lens]
    num_pages = sum(blocks)
    pages = torch.randperm(num_pages, generator=gen, dtype=torch.int32)
    # Entries past a request's blocks name page 0: in range, as an allocator's stale entries are.
    block_table = torch.zeros(len(seq_lens), table_width or max(blocks) + 2, dtype=torch.int32)
    start = 0
    for r, b in enumerate(blocks):
        block_table[r, :b] = pages[start:start + b]
        start += b
    kv = torch.randn(num_pages, HKV, BLOCK, 2 * D, generator=gen).to(kv_dtype)
    q = torch.randn(len(rows), HQ, D, generator=gen).to(q_dtype)
    selected = torch.tensor([[topk_row(gen, p, tail, t) for _, p in rows] for t in range(HKV)], dtype=torch.int32)
    return Step(arch=arch, q=q, kv_cache=kv, **make_scales(gen, scale_mode, num_pages),
                topk=in_layout(selected, layout), block_table=block_table, rows=rows,
                num_decodes=len(decode_seq_lens), decode_query_len=decode_query_len, seq_lens=seq_lens)


def topk_row(gen, p: int, tail: str, head: int) -> list[int]:
    """A token's top-k row: the own block, then distinct earlier ones (in odd heads the last read
    entry repeats an earlier one: it counts twice in both), then the tail vLLM's indexers write past
    n: the own block again (CUDA tests, benchmarks) or -1 (the ROCm indexer)."""
    n, own = entries_read(p), max(p, 0) // BLOCK
    earlier = torch.randperm(own, generator=gen)[: n - 1].tolist() if n > 1 else []
    row = [own] + earlier if n else []
    if n >= 3 and head % 2:
        row[-1] = row[1]
    return row + [own if tail == "own" else -1] * (TOPK - n)


def in_layout(selected: torch.Tensor, layout: str) -> torch.Tensor:
    """[HKV, tokens, TOPK] as a view of a top-k buffer: "cuda" [tokens, HKV, TOPK] transposed (the
    CUDA forward's topk_buffer.transpose(0, 1)), "rocm" [HKV, tokens, TOPK] as is, "strided" every
    other slot of [tokens, HKV, 2 * TOPK], the rest junk (stride 2 along the row)."""
    if layout == "rocm":
        return selected.clone()
    if layout == "cuda":
        return selected.transpose(0, 1).contiguous().transpose(0, 1)
    wide = torch.full((selected.shape[1], HKV, 2 * TOPK), -7, dtype=torch.int32)
    wide[..., ::2] = selected.transpose(0, 1)
    return wide[..., ::2].transpose(0, 1)


def make_scales(gen, scale_mode: str, num_pages: int) -> dict:
    if scale_mode == "none":
        return dict(k_scale=None, v_scale=None)
    if scale_mode == "scalar":  # 0-d, as the layers hold them; not powers of two, so a misplaced one shows
        return dict(k_scale=torch.tensor(0.73), v_scale=torch.tensor(1.31))
    # per_token_head: [HKV, slots] by physical slot, as transposed views of [slots, HKV]
    k, v = (0.5 + 0.6 * torch.rand(2, num_pages * BLOCK, HKV, generator=gen)).unbind(0)
    return dict(k_scale=k.t(), v_scale=v.t())


# ---------------------------------------------------------------------------------------------
# The two sides and the contract's reference.
# ---------------------------------------------------------------------------------------------
def vllm_decode(kernels: VllmKernels, step: Step) -> torch.Tensor:
    out = step.poisoned_output()
    kernels.decode[step.arch](*step.decode_args(out), **step.scales())
    return out[: step.nd]


def ours_decode(step: Step) -> torch.Tensor:
    from codegen import sparse_attn_decode

    out = step.poisoned_output()
    sparse_attn_decode(*step.decode_args(out), **step.scales(), arch=step.arch)
    return out[: step.nd]


def reference_decode(step: Step) -> torch.Tensor:
    from codegen import reference_decode as reference

    return reference(*step.decode_args(step.poisoned_output()), **step.scales()).to(step.q.dtype)


def vllm_prefill(kernels: VllmKernels, step: Step) -> torch.Tensor:
    out = step.poisoned_output()
    kernels.prefill[step.arch](*step.prefill_args(out), **step.scales())
    return out[step.nd:]


def ours_prefill(step: Step) -> torch.Tensor:
    from codegen import sparse_attn_prefill

    out = step.poisoned_output()
    sparse_attn_prefill(*step.prefill_args(out), **step.scales(), arch=step.arch)
    return out[step.nd:]


def reference_prefill(step: Step) -> torch.Tensor:
    from codegen import reference_prefill as reference

    return reference(*step.prefill_args(step.poisoned_output()), **step.scales()).to(step.q.dtype)


def assert_agree(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    torch.testing.assert_close(ours, theirs, **TOLERANCE[ours.dtype])


def rows_apart(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Tokens whose outputs differ by more than a wrong key could hide (1e-2), NaN included."""
    gap = (a.double() - b.double()).abs().flatten(1).nan_to_num(nan=float("inf")).amax(1)
    return [t for t, g in enumerate(gap.tolist()) if g > 1e-2]


# ---------------------------------------------------------------------------------------------
# Agreement.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_mode, layout", [("none", "cuda"), ("scalar", "strided"), ("per_token_head", "cuda")])
def test_prefill_agrees_fp8(vllm_kernels, scale_mode, layout):
    """Ragged prefill behind a decode request: a fresh prompt, a chunk across a block edge
    (positions 126-129), n from 1 to topk, own-block tails; each scale mode vLLM has."""
    step = make_step(decode_seq_lens=[300], prefill=PREFILL_REQUESTS, scale_mode=scale_mode, layout=layout, seed=1)
    assert_agree(ours_prefill(step), vllm_prefill(vllm_kernels, step))


@pytest.mark.parametrize("scale_mode, decode_query_len", [
    ("none", 4), ("scalar", 1), ("scalar", 3), ("per_token_head", 2), ("per_token_head", 4)])
def test_decode_agrees_fp8(vllm_kernels, scale_mode, decode_query_len):
    """Decode with 1-4 queries a request (speculative tokens), ahead of a prefill in the same step:
    q and output the first rows of the step's buffers, top-k a transposed or strided view. Each
    scale mode and each query length, not every pair: the interpreter is slow."""
    layout = ("cuda", "strided")[decode_query_len % 2]
    step = make_step(decode_seq_lens=DECODE_SEQ_LENS, decode_query_len=decode_query_len, prefill=[(40, 2)],
                     scale_mode=scale_mode, layout=layout, seed=10 + decode_query_len)
    assert_agree(ours_decode(step), vllm_decode(vllm_kernels, step))


def test_junk_past_n_agrees(vllm_kernels):
    """Entries past a token's n are never read by either: -1, ids past the request and 2^31 - 1
    there give the same outputs as the own-block tails of the tests above."""
    step = make_step(decode_seq_lens=DECODE_SEQ_LENS, decode_query_len=2, prefill=PREFILL_REQUESTS, tail="-1",
                     seed=3)
    tail = torch.tensor([-1, 9, INT32_MAX, FIRST_WRAPPING_ID], dtype=torch.int32)
    for t, (_, p) in enumerate(step.rows):
        n = entries_read(p)
        step.topk[:, t, n:] = tail[: TOPK - n]
    assert_agree(ours_decode(step), vllm_decode(vllm_kernels, step))
    assert_agree(ours_prefill(step), vllm_prefill(vllm_kernels, step))


def test_decode_junk_inside_n_agrees(vllm_kernels):
    """vLLM's decode checks each id against the token's blocks before using it, as the contract
    asks: -1, a later block of the request, ids past it, 2^24 and 2^31 - 1 inside n contribute
    nothing in both (and the outputs are the reference's)."""
    step = make_step(decode_seq_lens=DECODE_SEQ_LENS, decode_query_len=3, scale_mode="per_token_head", seed=4)
    junk = [-1, None, 40, FIRST_WRAPPING_ID, INT32_MAX]  # None: the block after the token's own
    for t, (_, p) in enumerate(step.rows):
        if entries_read(p) >= 2:
            pick = junk[t % len(junk)]
            step.topk[t % HKV, t, entries_read(p) - 1] = p // BLOCK + 1 if pick is None else pick
    ours = ours_decode(step)
    assert_agree(ours, vllm_decode(vllm_kernels, step))
    assert_agree(ours, reference_decode(step))


def test_prefill_later_blocks_inside_n_agree(vllm_kernels):
    """An id of a later block of the request inside n contributes nothing: vLLM's prefill masks
    its keys as lying after the token, msa-tune's compares block numbers."""
    # Positions 250-255 lie in block 1 of a request of 3 blocks (prefill tokens end their request).
    step = make_step(decode_seq_lens=[300], prefill=[(0, 3), (250, 10)], scale_mode="scalar", seed=5)
    changed = []
    for t, (r, p) in enumerate(step.rows[step.nd:], start=step.nd):
        last_block = cdiv(step.seq_lens[r], BLOCK) - 1
        if entries_read(p) >= 2 and p // BLOCK < last_block:
            step.topk[:, t, entries_read(p) - 1] = last_block
            changed.append(p)
    assert changed == list(range(250, 256))
    assert_agree(ours_prefill(step), vllm_prefill(vllm_kernels, step))


@pytest.mark.parametrize("arch, layout, tail", [("sm90", "cuda", "own"), ("gfx942", "rocm", "-1")])
def test_fp16_cache_agrees(vllm_kernels, arch, layout, tail):
    """A 16-bit cache, with fp16 queries (vLLM's kernels need q in the cache's dtype). gfx942:
    vLLM's ROCm prefill, with -1 tails as vLLM's ROCm indexer writes them."""
    common = dict(kv_dtype=torch.float16, scale_mode="none", q_dtype=torch.float16, arch=arch, layout=layout,
                  tail=tail)
    step = make_step(decode_seq_lens=[300], prefill=PREFILL_REQUESTS, seed=6, **common)
    assert_agree(ours_prefill(step), vllm_prefill(vllm_kernels, step))
    step = make_step(decode_seq_lens=DECODE_SEQ_LENS, decode_query_len=2, seed=7, **common)
    assert_agree(ours_decode(step), vllm_decode(vllm_kernels, step))


def test_fnuz_cache_cannot_run_here(vllm_kernels):
    """Why gfx942's fp8 has no witness: Triton 3.6's interpreter cannot load float8_e4m3fnuz
    ("fail to convert fp8e4b8"), in vLLM's kernels or msa-tune's. If this starts to fail, add
    e4m3fnuz (arch="gfx942") to the agreement tests."""
    from triton.runtime.errors import InterpreterError

    step = make_step(decode_seq_lens=[300], kv_dtype=torch.float8_e4m3fnuz, arch="gfx942", layout="rocm", seed=8)
    with pytest.raises(InterpreterError, match="fp8e4b8"):
        vllm_decode(vllm_kernels, step)
    with pytest.raises(InterpreterError, match="fp8e4b8"):
        ours_decode(step)


# ---------------------------------------------------------------------------------------------
# Differences by design: vLLM's result moves, msa-tune's is the contract's reference.
# ---------------------------------------------------------------------------------------------
def test_difference_prefill_uses_junk_ids_inside_n(vllm_kernels):
    """Junk inside the first n entries. The contract: -1 or an id outside the request's blocks
    contributes nothing and is never used as an index. vLLM's prefill kernel checks no id: for -1
    it loads the block-table entry before the row (here the previous request's last entry) and
    attends to that page's keys at positions -128..-1, which pass its causal and length masks. Its
    decode kernel does check (test_decode_junk_inside_n_agrees)."""
    step = make_step(decode_seq_lens=[300], prefill=PREFILL_REQUESTS, scale_mode="scalar", seed=9)
    junk_tokens = []
    for t, (_, p) in enumerate(step.rows[step.nd:]):
        if entries_read(p) >= 2:
            step.topk[0, step.nd + t, entries_read(p) - 1] = -1  # KV head 0 only: head 1's rows stay clean
            junk_tokens.append(t)
    assert junk_tokens
    ours, theirs, reference = ours_prefill(step), vllm_prefill(vllm_kernels, step), reference_prefill(step)
    assert_agree(ours, reference)
    assert rows_apart(theirs, reference) == junk_tokens
    assert_agree(theirs[:, HQ // HKV:], reference[:, HQ // HKV:])  # KV head 1's query heads


def test_difference_prefill_block_offset_wraps_at_2_24(vllm_kernels):
    """The 2^24 offset overflow. vLLM's prefill computes a block's first position as blk * 128 in
    int32: id 2^24 gives 2^31, which wraps to -2^31, so the block's keys pass the causal and length
    masks and count (its page read from block_table[row, 2^24]: a 64 MiB table here keeps that read
    inside the tensor). msa-tune compares block numbers, never block * 128 (docs/contract.md)."""
    step = make_step(prefill=[(200, 3)], scale_mode="per_token_head", table_width=FIRST_WRAPPING_ID + 1, seed=11)
    step.block_table[0, FIRST_WRAPPING_ID] = step.block_table[0, 1]  # the own page: all 128 slots count
    step.topk[:, :, 1] = FIRST_WRAPPING_ID  # positions 200-202 read two entries: own block, then this
    ours, theirs, reference = ours_prefill(step), vllm_prefill(vllm_kernels, step), reference_prefill(step)
    assert_agree(ours, reference)
    assert rows_apart(theirs, reference) == [0, 1, 2]


def test_difference_padded_decode_rows(vllm_kernels):
    """Padded decode rows. vLLM pads a CUDA-graph batch with zero-length requests; a token with no
    visible key gets zeros in the contract (never NaN), while vLLM's merge divides 0 by 0 there
    (its own comment: "All-empty padded rows may still produce NaNs in merge"). Real rows agree."""
    step = make_step(decode_seq_lens=[300, 0, 140, 0], decode_query_len=2, scale_mode="scalar", seed=12)
    ours, theirs = ours_decode(step), vllm_decode(vllm_kernels, step)
    padded = [t for t, (r, _) in enumerate(step.rows) if step.seq_lens[r] == 0]
    real = [t for t in range(step.nd) if t not in padded]
    assert_agree(ours, reference_decode(step))
    assert_agree(ours[real], theirs[real])
    assert torch.equal(ours[padded], torch.zeros_like(ours[padded]))
    assert theirs[padded].isnan().all()


def test_difference_rocm_prefill_needs_minus_one_tails(vllm_kernels):
    """The ROCm prefill (amd/ops/sparse_attn.py) reads as many entries as the row has non-negative
    ids, not the first min(topk, p // 128 + 1): it relies on vLLM's ROCm indexer writing -1 past n
    (with those it agrees: test_fp16_cache_agrees). With the own block repeated there, as vLLM's
    CUDA tests and benchmarks write rows, it counts the own block again for every token whose n is
    below topk; the contract (and vLLM's common kernels) never read past n."""
    step = make_step(decode_seq_lens=[300], prefill=PREFILL_REQUESTS, kv_dtype=torch.float16, scale_mode="none",
                     q_dtype=torch.float16, arch="gfx942", layout="rocm", tail="own", seed=13)
    ours, theirs, reference = ours_prefill(step), vllm_prefill(vllm_kernels, step), reference_prefill(step)
    assert_agree(ours, reference)
    # A token reading the own block alone is unmoved: its one block counted 4 times weighs the same.
    moved = [t for t, (_, p) in enumerate(step.rows[step.nd:]) if 2 <= entries_read(p) < TOPK]
    assert moved and rows_apart(theirs, reference) == moved
