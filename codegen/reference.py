"""Reference MSA attention: dequantized K/V in float64 (or float32), plain softmax, one token at a time.

Written to be read, not to be fast: every kernel and the tuner are checked against it.
"""
from __future__ import annotations

import torch

from .variants import PAGE_SIZE


def _scale_mode(k_scale, v_scale) -> str:
    """The scale mode read off the scales' shapes (docs/contract.md, "Scale modes"): none, one
    element each, or [Hkv, N] each. Not validate.scale_mode_of on purpose: the API picks its kernel
    with that one, and a reference sharing it would agree with a wrong pick. The reference assumes
    valid scales (the API's checks refuse the rest); it only refuses what it cannot read."""
    if k_scale is None and v_scale is None:
        return "none"
    if k_scale is None or v_scale is None:
        raise ValueError("k_scale, v_scale: the reference takes both scales or neither")
    if k_scale.numel() == 1 and v_scale.numel() == 1:
        return "scalar"
    if k_scale.dim() == 2 and v_scale.dim() == 2:
        return "per_token_head"
    raise ValueError(f"k_scale, v_scale: expected one element each or [Hkv, N] each, got shapes "
                     f"{tuple(k_scale.shape)} and {tuple(v_scale.shape)}")


def _dequantized_kv(kv_cache: torch.Tensor, k_scale, v_scale, dtype: torch.dtype):
    """K and V as [num_blocks, Hkv, 128, D] in `dtype`, with the scales applied element-wise."""
    mode = _scale_mode(k_scale, v_scale)
    head_dim = kv_cache.shape[3] // 2
    kv = kv_cache.to(dtype)
    k, v = kv[..., :head_dim], kv[..., head_dim:]
    if mode == "scalar":
        k = k * k_scale.reshape(()).to(dtype)
        v = v * v_scale.reshape(()).to(dtype)
    elif mode == "per_token_head":
        num_blocks, num_kv_heads = kv_cache.shape[:2]

        def per_slot(scale):  # [Hkv, N] indexed by physical slot -> [num_blocks, Hkv, 128, 1]
            s = scale[:, : num_blocks * PAGE_SIZE].to(dtype).reshape(num_kv_heads, num_blocks, PAGE_SIZE)
            return s.permute(1, 0, 2).unsqueeze(-1)

        k = k * per_slot(k_scale)
        v = v * per_slot(v_scale)
    return k, v


def entries_read(topk: int, kv_len: int) -> int:
    """How many entries of its top-k row a token reads (vLLM's contract; no sentinel): a token at
    position p has kv_len = p + 1 keys before and including it, and reads its first
    n = min(topk, cdiv(kv_len, 128)) entries, which is min(topk, p // 128 + 1). Whatever follows
    them is never read."""
    return min(topk, -(-max(kv_len, 0) // PAGE_SIZE))


def read_mask(kv_len: torch.Tensor, topk: int) -> torch.Tensor:
    """entries_read over tensors: [..., topk] bool, True for the entries of each token's row that it
    reads (`kv_len` [...], position + 1 per token; 0 or less reads nothing)."""
    n_read = torch.clamp((kv_len.clamp_min(0) + PAGE_SIZE - 1) // PAGE_SIZE, max=topk)
    return torch.arange(topk, device=kv_len.device) < n_read[..., None]


def _attend_token(out, q, k, v, topk_idx, block_table, t: int, req: int, kv_len: int, seq_len: int,
                  sm_scale: float):
    """Writes out[t] = softmax(q[t] . K * sm_scale) @ V over the keys token t may see: those of its
    first `entries_read` top-k entries at positions < kv_len. An entry that is not one of the
    request's logical blocks [0, cdiv(seq_len, 128)) (a -1 pad, a stale id) contributes nothing;
    an entry listed twice counts twice (as a per-entry walk does)."""
    num_kv_heads = k.shape[1]
    gqa = q.shape[1] // num_kv_heads
    request_blocks = -(-seq_len // PAGE_SIZE)
    n = entries_read(topk_idx.shape[2], kv_len)
    positions = torch.arange(PAGE_SIZE)
    for g in range(num_kv_heads):
        keys, values = [], []
        for blk in topk_idx[g, t, :n].tolist():
            if not 0 <= blk < request_blocks:
                continue
            visible = blk * PAGE_SIZE + positions < kv_len  # causal (kv_len <= seq_len)
            if not visible.any():
                continue
            page = int(block_table[req, blk])
            keys.append(k[page, g][visible])
            values.append(v[page, g][visible])
        heads = slice(g * gqa, (g + 1) * gqa)
        if not keys:
            out[t, heads] = 0
            continue
        kk, vv = torch.cat(keys), torch.cat(values)
        scores = (q[t, heads].to(kk.dtype) @ kk.T) * sm_scale
        out[t, heads] = torch.softmax(scores, dim=-1) @ vv


def _result(out, output):
    if output is None:
        return out
    output.copy_(out.to(output.device, output.dtype))
    return output


def reference_prefill(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
                      num_kv_heads, sm_scale, output=None, k_scale=None, v_scale=None, *, dtype=torch.float64):
    """Same arguments as sparse_attn_prefill; returns a `dtype` CPU tensor (also copied into `output` if given)."""
    cpu = lambda x: None if x is None else x.detach().cpu()  # noqa: E731
    q, kv_cache, topk_idx, block_table = cpu(q), cpu(kv_cache), cpu(topk_idx), cpu(block_table)
    k, v = _dequantized_kv(kv_cache, cpu(k_scale), cpu(v_scale), dtype)
    out = torch.zeros(q.shape, dtype=dtype)
    cu, lens, prefix = cpu(cu_seqlens_q).tolist(), cpu(seq_lens).tolist(), cpu(prefix_lens).tolist()
    for req in range(len(lens)):
        for i in range(cu[req + 1] - cu[req]):
            p = prefix[req] + i  # the token's position
            _attend_token(out, q, k, v, topk_idx, block_table, cu[req] + i, req, min(p + 1, lens[req]), lens[req],
                          sm_scale)
    return _result(out, output)


def reference_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
                     decode_query_len, k_scale=None, v_scale=None, query_start_loc=None, token_to_req_indices=None,
                     *, dtype=torch.float64):
    """Same arguments as sparse_attn_decode; padded rows are zeros. Returns a `dtype` CPU tensor."""
    cpu = lambda x: None if x is None else x.detach().cpu()  # noqa: E731
    q, kv_cache, topk_idx, block_table = cpu(q), cpu(kv_cache), cpu(topk_idx), cpu(block_table)
    k, v = _dequantized_kv(kv_cache, cpu(k_scale), cpu(v_scale), dtype)
    out = torch.zeros(q.shape, dtype=dtype)
    lens = cpu(seq_lens).tolist()
    if query_start_loc is None:
        rows = [(r * decode_query_len + j, r, decode_query_len, j) for r in range(len(lens)) for j in range(decode_query_len)]
    else:
        starts = cpu(query_start_loc).tolist()
        reqs = cpu(token_to_req_indices).tolist()
        rows = [(t, reqs[t], starts[reqs[t] + 1] - starts[reqs[t]], t - starts[reqs[t]]) for t in range(starts[-1])]
    for t, req, q_len, j in rows:
        p = lens[req] - q_len + j  # the token's position
        _attend_token(out, q, k, v, topk_idx, block_table, t, req, min(p + 1, lens[req]), lens[req], sm_scale)
    return _result(out, output)


def reference_batched(case_kernel: str, args: dict, *, dtype=torch.float32, chunk_tokens: int = 256) -> torch.Tensor:
    """The same function as reference_prefill / reference_decode, vectorized over tokens on the
    inputs' device (the tuner checks large buckets with it). Gathers each token's selected pages,
    masks invisible keys, plain softmax; `chunk_tokens` bounds the gathered memory."""
    q, kv_cache, topk_idx, block_table = args["q"], args["kv_cache"], args["topk_idx"], args["block_table"]
    device = q.device
    k, v = _dequantized_kv(kv_cache, args.get("k_scale"), args.get("v_scale"), dtype)  # [NB, Hkv, 128, D]
    req, kv_end = token_rows(case_kernel, args)
    total_q, num_q_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[1]
    topk = topk_idx.shape[2]
    gqa = num_q_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=dtype, device=device)
    slots = torch.arange(PAGE_SIZE, device=device)
    heads = torch.arange(num_kv_heads, device=device)
    # The same rule as _attend_token, per token: the first n = min(topk, cdiv(kv_len, 128))
    # entries (read_mask), each counted only if it is one of the request's blocks.
    read = read_mask(kv_end, topk)  # [total_q, topk]
    request_blocks = (args["seq_lens"].long()[req] + PAGE_SIZE - 1) // PAGE_SIZE
    for lo in range(0, len(req), chunk_tokens):
        t = torch.arange(lo, min(lo + chunk_tokens, len(req)), device=device)
        blk = topk_idx[:, t].permute(1, 0, 2).long()  # [T, Hkv, topk]
        valid = read[t][:, None, :] & (blk >= 0) & (blk < request_blocks[t][:, None, None])
        blk = torch.where(valid, blk, 0)  # never an index outside the request's blocks
        page = block_table[req[t][:, None, None], blk].long()  # [T, Hkv, topk]
        pos = blk[..., None] * PAGE_SIZE + slots  # [T, Hkv, topk, 128]
        seen = valid[..., None] & (pos < kv_end[t][:, None, None, None])
        kk = k[page, heads[None, :, None]]  # [T, Hkv, topk, 128, D]
        vv = v[page, heads[None, :, None]]
        kk = kk.flatten(2, 3)
        vv = vv.flatten(2, 3)
        seen = seen.flatten(2, 3)  # [T, Hkv, topk*128]
        qq = q[t].to(dtype).view(len(t), num_kv_heads, gqa, head_dim)
        scores = torch.einsum("thgd,thkd->thgk", qq, kk) * args["sm_scale"]
        scores = scores.masked_fill(~seen[:, :, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no visible key -> zeros
        out[t] = torch.einsum("thgk,thkd->thgd", probs, vv).reshape(len(t), num_q_heads, head_dim)
    return out


def token_rows(case_kernel: str, args: dict):
    """(request, kv_end) of each real query row; padded rows come after them and stay zero."""
    device = args["q"].device
    if case_kernel == "prefill":
        cu = args["cu_seqlens_q"].long()
        q_lens = cu[1:] - cu[:-1]
        req = torch.repeat_interleave(torch.arange(len(q_lens), device=device), q_lens)
        pos = args["prefix_lens"].long()[req] + torch.arange(len(req), device=device) - cu[:-1][req]
        kv_end = torch.minimum(pos + 1, args["seq_lens"].long()[req])
    else:
        lens = args["seq_lens"].long()
        if args.get("query_start_loc") is None:
            qlen = args["decode_query_len"]
            t = torch.arange(len(lens) * qlen, device=device)
            req, j, q_len = t // qlen, t % qlen, qlen
        else:
            starts = args["query_start_loc"].long()
            n = int(starts[-1])
            req = args["token_to_req_indices"].long()[:n]
            j = torch.arange(n, device=device) - starts[req]
            q_len = (starts[1:] - starts[:-1])[req]
        kv_end = torch.minimum(lens[req] - q_len + j + 1, lens[req])
    return req, kv_end
