"""The fp64 reference of the tester, written from docs/contract.md alone (it imports nothing of
codegen): token t at position p, query head h of KV head g reads the first min(topk, p // 128 + 1)
entries of its top-k row; an entry b with 0 <= b <= p // 128 contributes the keys b * 128 + j <= p
of page block_table[req, b] (an entry listed twice counts twice); the output is
softmax(q . k * sm_scale) @ v over them, zeros for a row with no key (a padded decode row).

With `sensitivity=True` it also gives, per row, how far the output moves when the scores' operands
are rounded: a kernel's tensor-core dots take q and K in a 16-bit type, so score j carries an error
of about u * s_j, s_j = sm_scale * ||q o k_j|| (elementwise product, L2; u the type's unit roundoff),
independent between keys; to first order the output then moves by sum_j p_j e_j (v_j - o), whose
expected norm is u * sqrt(sum_j p_j^2 s_j^2 ||v_j - o||^2). That sqrt is the row's sensitivity. It
grows with |q| * |k|: queries with outlier entries make it large (issue 35)."""
from __future__ import annotations

import torch

PAGE = 128


def _scale_rows(scale, g, slots):
    """The per-key scale of KV head `g` at physical `slots` ([...]) for a scale mode's tensor: None
    (no scale), one element (scalar), or [Hkv, >= slots] (per_token_head, any strides)."""
    if scale is None:
        return None
    if scale.numel() == 1:
        return scale.reshape(()).to(torch.float64)
    return scale[g].to(torch.float64)[slots]


def attention(q, kv_cache, topk_idx, block_table, token_req, token_pos, sm_scale, k_scale=None, v_scale=None,
              *, sensitivity: bool = False, budget_bytes: int = 1 << 29):
    """fp64 output [T, Hq, D] (and with sensitivity=True, each row's [T, Hq], see above).
    token_req / token_pos: [T] long, the request and position of each query row (position -1: a
    padded row, zeros). Chunked over tokens to hold about budget_bytes."""
    total_q, hq, d = q.shape
    hkv, _, topk = topk_idx.shape
    group = hq // hkv
    out = torch.zeros(total_q, hq, d, dtype=torch.float64, device=q.device)
    sens = torch.zeros(total_q, hq, dtype=torch.float64, device=q.device)
    per_token = topk * PAGE * d * 8 * 3  # K, V and their scaled copies, fp64
    chunk = max(1, budget_bytes // per_token)
    slot = torch.arange(PAGE, device=q.device)
    for start in range(0, total_q, chunk):
        rows = slice(start, min(start + chunk, total_q))
        pos, req = token_pos[rows], token_req[rows]
        n_causal = torch.where(pos >= 0, pos // PAGE + 1, 0)
        n_read = torch.clamp(n_causal, max=topk)
        for g in range(hkv):
            ids = topk_idx[g, rows].long()  # [Tc, topk]
            entry = torch.arange(topk, device=q.device)
            live = (entry[None, :] < n_read[:, None]) & (ids >= 0) & (ids < n_causal[:, None])
            blocks = torch.where(live, ids, 0)
            pages = block_table[req.clamp(min=0)[:, None], blocks].long()  # [Tc, topk]
            pages = torch.where(live, pages, 0)
            key_pos = blocks[..., None] * PAGE + slot  # [Tc, topk, 128]
            seen = live[..., None] & (key_pos <= pos[:, None, None])
            kv = kv_cache[pages, g].to(torch.float64)  # [Tc, topk, 128, 2D]
            kv = torch.where(seen[..., None], kv, 0.0)  # unseen slots may hold anything, NaN included
            k, v = kv[..., :d], kv[..., d:]
            slots = pages[..., None] * PAGE + slot
            ks, vs = _scale_rows(k_scale, g, slots), _scale_rows(v_scale, g, slots)
            if ks is not None:
                k = k * (ks[..., None] if ks.dim() else ks)
                v = v * (vs[..., None] if vs.dim() else vs)
            qg = q[rows, g * group:(g + 1) * group].to(torch.float64)  # [Tc, G, D]
            scores = torch.einsum("tgd,tknd->tgkn", qg, k) * sm_scale
            scores = scores.masked_fill(~seen[:, None], float("-inf")).flatten(2)
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
            o = torch.einsum("tgs,tsd->tgd", probs, v.flatten(1, 2))
            out[rows, g * group:(g + 1) * group] = o
            if sensitivity:
                s2 = torch.einsum("tgd,tknd->tgkn", qg * qg, k * k).flatten(2) * sm_scale ** 2
                v_o = torch.einsum("tknd,tgd->tgkn", v, o).flatten(2)
                dist2 = ((v * v).sum(-1).flatten(1)[:, None] - 2 * v_o + (o * o).sum(-1)[..., None]).clamp_min(0)
                sens[rows, g * group:(g + 1) * group] = (probs * probs * s2 * dist2).sum(-1).sqrt()
    return (out, sens) if sensitivity else out
