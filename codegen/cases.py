"""Inputs built like real serving, for the accuracy gates, the tuner and the benchmark.

Random physical page order, a token-major (strided) cache view, a transposed top-k view, the own
block plus distinct earlier blocks, -1 tail padding, ragged requests with and without prefix,
uniform and varlen decode with speculative rows and padded rows. Never zeros.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .variants import PAGE_SIZE, get_arch


@dataclasses.dataclass
class Case:
    kernel: str  # "prefill" or "decode"
    args: dict  # keyword arguments of sparse_attn_prefill / sparse_attn_decode (and the references)
    scale_mode: str

    @property
    def output(self) -> torch.Tensor:
        return self.args["output"]

    def poison(self) -> None:
        """Fills the output with NaN so an unwritten element can never pass."""
        self.output.fill_(float("nan"))


def _kv_dtype(arch: str, kv_dtype: str) -> torch.dtype:
    if kv_dtype == "fp8":
        return get_arch(arch).fp8_dtype
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[kv_dtype]


def _paged_cache(gen, num_pages, num_kv_heads, head_dim, dtype, device, strided):
    """Cache [num_pages, Hkv, 128, 2D]; strided=True gives a token-major physical layout view."""
    if strided:
        base = torch.randn(num_pages, PAGE_SIZE, num_kv_heads, 2 * head_dim, generator=gen)
        cache = base.to(dtype).to(device).permute(0, 2, 1, 3)
    else:
        cache = torch.randn(num_pages, num_kv_heads, PAGE_SIZE, 2 * head_dim, generator=gen).to(dtype).to(device)
    return cache


def _scales(gen, scale_mode, num_kv_heads, num_pages, device):
    if scale_mode == "none":
        return None, None
    if scale_mode == "scalar":
        # Non-power-of-two values: a misplaced scale must change the result visibly.
        k, v = 0.5 + 0.6 * torch.rand(2, generator=gen)
        return (torch.tensor([k.item()], dtype=torch.float32, device=device),
                torch.tensor([v.item()], dtype=torch.float32, device=device))
    # per_token_head: [Hkv, N] views with non-unit strides and a few spare slots.
    slots = num_pages * PAGE_SIZE + 64
    k = (0.5 + 0.6 * torch.rand(slots, num_kv_heads, generator=gen)).to(device).t()
    v = (0.5 + 0.6 * torch.rand(slots, num_kv_heads, generator=gen)).to(device).t()
    return k, v


def _block_tables(gen, seq_lens, spare_pages):
    """Each request's logical blocks on distinct physical pages, in random order."""
    blocks = [math.ceil(s / PAGE_SIZE) for s in seq_lens]
    num_pages = sum(blocks) + spare_pages
    perm = torch.randperm(num_pages, generator=gen)
    width = max(max(blocks, default=1), 1)
    # Unused entries point at random pages: reading one by mistake gives a wrong (caught) answer.
    table = torch.randint(0, num_pages, (len(seq_lens), width), generator=gen, dtype=torch.int32)
    at = 0
    for r, n in enumerate(blocks):
        table[r, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return table, num_pages


def _selection(gen, q_pos, topk, num_blocks_in_seq, pattern, shared_scores=None, future_ok=True):
    """Top-k logical blocks of one query at q_pos: own block always in, distinct, -1 tail padding."""
    own = q_pos // PAGE_SIZE
    earlier = torch.arange(own)
    if pattern == "correlated" and shared_scores is not None:
        noisy = shared_scores[:own] + 0.1 * torch.randn(own, generator=gen)
        chosen = earlier[torch.argsort(noisy, descending=True)[: topk - 1]]
    else:
        chosen = earlier[torch.randperm(own, generator=gen)[: topk - 1]]
    chosen = chosen.tolist()
    # Sometimes select a block past the query (all keys invisible): it must contribute nothing.
    if future_ok and own + 1 < num_blocks_in_seq and len(chosen) < topk - 1 and torch.rand(1, generator=gen) < 0.5:
        chosen.append(own + 1)
    order = torch.randperm(len(chosen) + 1, generator=gen).tolist()
    ids = [([own] + chosen)[i] for i in order]
    return ids + [-1] * (topk - len(ids))


def _topk_tensor(rows_per_head, num_kv_heads, total_q, topk, device, gen, padded_rows_garbage=0):
    """[Hkv, total_q, topk] int32 as a transposed view of a [total_q, Hkv, topk] buffer."""
    buf = torch.randint(-(2 ** 20), 2 ** 20, (total_q, num_kv_heads, topk), generator=gen, dtype=torch.int32)
    for g, rows in enumerate(rows_per_head):
        for t, ids in enumerate(rows):
            buf[t, g] = torch.tensor(ids, dtype=torch.int32)
    return buf.to(device).permute(1, 0, 2)


def prefill_case(*, arch: str, q_lens, prefix_lens, num_q_heads: int, num_kv_heads: int, head_dim: int = 128,
                 topk: int = 16, kv_dtype: str = "fp8", scale_mode: str = "scalar", q_dtype=torch.float32,
                 device="cpu", seed: int = 0, pattern: str = "random", strided: bool = True) -> Case:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + n for p, n in zip(prefix_lens, q_lens)]
    table, num_pages = _block_tables(gen, seq_lens, spare_pages=2)
    total_q = sum(q_lens)
    rows = [[] for _ in range(num_kv_heads)]
    for r, (p, n) in enumerate(zip(prefix_lens, q_lens)):
        nblk = math.ceil(seq_lens[r] / PAGE_SIZE)
        for g in range(num_kv_heads):
            shared = torch.randn(nblk, generator=gen)
            for i in range(n):
                rows[g].append(_selection(gen, p + i, topk, nblk, pattern, shared))
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    k_scale, v_scale = _scales(gen, scale_mode, num_kv_heads, num_pages, device)
    args = dict(
        q=torch.randn(total_q, num_q_heads, head_dim, generator=gen).to(q_dtype).to(device),
        kv_cache=_paged_cache(gen, num_pages, num_kv_heads, head_dim, _kv_dtype(arch, kv_dtype), device, strided),
        topk_idx=_topk_tensor(rows, num_kv_heads, total_q, topk, device, gen),
        block_table=table.to(device),
        cu_seqlens_q=cu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=device),
        max_query_len=max(q_lens, default=0),
        num_kv_heads=num_kv_heads,
        sm_scale=head_dim ** -0.5,
        output=torch.empty(total_q, num_q_heads, head_dim, dtype=q_dtype, device=device),
        k_scale=k_scale,
        v_scale=v_scale,
    )
    return Case("prefill", args, scale_mode)


def decode_case(*, arch: str, seq_lens, num_q_heads: int, num_kv_heads: int, head_dim: int = 128, topk: int = 16,
                kv_dtype: str = "fp8", scale_mode: str = "scalar", q_dtype=torch.float32, device="cpu", seed: int = 0,
                decode_query_len: int = 1, varlen_q_lens=None, padded_rows: int = 0, strided: bool = True) -> Case:
    """Uniform decode (decode_query_len per request) or varlen (varlen_q_lens, 0 allowed), plus
    `padded_rows` rows past the last real token (as in a padded CUDA-graph batch)."""
    gen = torch.Generator().manual_seed(seed)
    table, num_pages = _block_tables(gen, seq_lens, spare_pages=2)
    q_lens = list(varlen_q_lens) if varlen_q_lens is not None else [decode_query_len] * len(seq_lens)
    real = sum(q_lens)
    total_q = real + padded_rows
    rows = [[] for _ in range(num_kv_heads)]
    for r, (s, n) in enumerate(zip(seq_lens, q_lens)):
        nblk = math.ceil(s / PAGE_SIZE)
        for g in range(num_kv_heads):
            for j in range(n):
                rows[g].append(_selection(gen, s - n + j, topk, nblk, "random", future_ok=False))
    k_scale, v_scale = _scales(gen, scale_mode, num_kv_heads, num_pages, device)
    args = dict(
        q=torch.randn(total_q, num_q_heads, head_dim, generator=gen).to(q_dtype).to(device),
        kv_cache=_paged_cache(gen, num_pages, num_kv_heads, head_dim, _kv_dtype(arch, kv_dtype), device, strided),
        topk_idx=_topk_tensor(rows, num_kv_heads, total_q, topk, device, gen),
        block_table=table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_kv_heads=num_kv_heads,
        sm_scale=head_dim ** -0.5,
        output=torch.empty(total_q, num_q_heads, head_dim, dtype=q_dtype, device=device),
        decode_query_len=decode_query_len,
        k_scale=k_scale,
        v_scale=v_scale,
        query_start_loc=None,
        token_to_req_indices=None,
    )
    if varlen_q_lens is not None:
        starts = [0] + torch.tensor(q_lens).cumsum(0).tolist()
        t2r = [r for r, n in enumerate(q_lens) for _ in range(n)]
        t2r += torch.randint(-1000, 1000, (padded_rows,), generator=gen).tolist()  # garbage: must not be read
        args["query_start_loc"] = torch.tensor(starts, dtype=torch.int32, device=device)
        args["token_to_req_indices"] = torch.tensor(t2r, dtype=torch.int32, device=device)
    return Case("decode", args, scale_mode)


def run_kernel(case: Case, **kw):
    from .api import sparse_attn_decode, sparse_attn_prefill

    fn = sparse_attn_prefill if case.kernel == "prefill" else sparse_attn_decode
    return fn(**case.args, **kw)


def run_reference(case: Case, dtype=torch.float64):
    from .reference import reference_decode, reference_prefill

    args = dict(case.args, output=None)
    fn = reference_prefill if case.kernel == "prefill" else reference_decode
    return fn(**args, dtype=dtype)
