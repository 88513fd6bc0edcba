"""What one call must do at least: useful FLOPs and the bytes it must move (the floors)."""
from __future__ import annotations

import torch

from .cases import Case
from .variants import PAGE_SIZE


def visible_keys(case: Case) -> torch.Tensor:
    """[Hkv, total_q] number of keys each (KV head, query row) attends to."""
    a = case.args
    topk = a["topk_idx"]
    total_q = topk.shape[1]
    kv_end = torch.zeros(total_q, dtype=torch.long, device=topk.device)
    if case.kernel == "prefill":
        cu = a["cu_seqlens_q"].long()
        q_lens = cu[1:] - cu[:-1]
        req = torch.repeat_interleave(torch.arange(len(q_lens), device=topk.device), q_lens)
        pos = a["prefix_lens"].long()[req] + torch.arange(len(req), device=topk.device) - cu[:-1][req]
        kv_end[: len(req)] = torch.minimum(pos + 1, a["seq_lens"].long()[req])
    else:
        lens = a["seq_lens"].long()
        if a["query_start_loc"] is None:
            qlen = a["decode_query_len"]
            n = len(lens) * qlen
            t = torch.arange(n, device=topk.device)
            req, j, q_len = t // qlen, t % qlen, qlen
        else:
            starts = a["query_start_loc"].long()
            n = int(starts[-1])
            req = a["token_to_req_indices"].long()[:n]
            j = torch.arange(n, device=topk.device) - starts[req]
            q_len = (starts[1:] - starts[:-1])[req]
        pos = lens[req] - q_len + j
        kv_end[:n] = torch.minimum(pos + 1, lens[req])
    blk = topk.long()
    per_block = (kv_end[None, :, None] - blk * PAGE_SIZE).clamp(0, PAGE_SIZE)
    per_block = torch.where(blk >= 0, per_block, 0)
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
