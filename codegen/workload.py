"""What one call must do at least: useful FLOPs and the bytes it must move (the floors)."""
from __future__ import annotations

import torch

from .cases import Case
from .reference import read_mask, token_rows
from .variants import PAGE_SIZE


def visible_keys(case: Case) -> torch.Tensor:
    """[Hkv, total_q] number of keys each (KV head, query row) attends to: those of the entries a
    token reads (its first min(topk, cdiv(kv_len, 128)), reference.read_mask) at positions
    before kv_len; other entries, padded rows and invisible keys count nothing."""
    topk = case.args["topk_idx"]
    req, kv_end_real = token_rows(case.kernel, case.args)
    kv_end = torch.zeros(topk.shape[1], dtype=torch.long, device=topk.device)  # padded rows see nothing
    kv_end[: len(req)] = kv_end_real
    read = read_mask(kv_end, topk.shape[2])[None]  # [1, total_q, topk]
    blk = topk.long()
    per_block = (kv_end[None, :, None] - blk * PAGE_SIZE).clamp(0, PAGE_SIZE)
    per_block = torch.where(read & (blk >= 0), per_block, 0)
    return per_block.sum(-1)


def useful_flops(case: Case) -> int:
    """4 x query heads per KV head x visible keys x head_dim, summed (QK^T and PV, 2 FLOPs a MAC)."""
    q = case.args["q"]
    gqa = q.shape[1] // case.args["num_kv_heads"]
    return int(4 * gqa * q.shape[2] * visible_keys(case).sum())


def min_bytes(case: Case) -> int:
    """Selected visible K/V (with their per-token scales), queries read once and outputs written once."""
    a = case.args
    q, kv = a["q"], a["kv_cache"]
    head_dim = q.shape[2]
    keys = int(visible_keys(case).sum())
    per_key = 2 * head_dim * kv.element_size() + (8 if case.scale_mode == "per_token_head" else 0)
    return keys * per_key + 2 * q.numel() * q.element_size()
