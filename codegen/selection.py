"""Prefill: multi-token tiles or the per-token path, decided on the device from the selections.

A tile of `block_t` tokens loads the union of their selected pages and scores every row against
it. When neighbouring tokens pick the same blocks (the indexer's usual output) the union is about
one token's 16 pages and the tile is the fast path; when they pick unrelated blocks the union
grows towards block_t x 16 and the tile does that many times the useful work, where the per-token
path does none wasted. The H200 measurements behind the thresholds: TILE_WASTE_SHARE below.

The decision stays on the GPU (no host sync, CUDA-graph safe): both paths are launched, and the
one not chosen gets its cu_seqlens_q multiplied by 0, so each of its programs reads an empty
request and returns. For the Triton tiles the API computes the estimate, the decision and both
offsets in one launch (codegen.selection_kernel); tile_inflation, choose_tiles and split_seqlens here
are the torch rendering it is tested against. The Gluon tile (prefill_ws) decides in its own plan
launch, exactly over every tile it would run (selection_kernel.PlanDecision): at its own block_t
(16 tokens at GQA 8, threshold 8.5), where the Triton tiles' estimate samples 8-token tiles.
"""
from __future__ import annotations

import torch

from .reference import read_mask
from .validate import check_int
from .variants import PAGE_SIZE, SCALE_MODES, get_arch

SELECTIONS = ("tiled", "per_token", "auto")
SAMPLED_TILES = 256  # tiles per KV head the estimate looks at, spread evenly over the tokens


def check_selection(selection: str) -> str:
    if selection not in SELECTIONS:
        raise ValueError(f"selection: expected one of {SELECTIONS}, got {selection!r}")
    return selection


# How much of a tile's extra work each scale mode's tiles absorb before the per-token path wins:
# tiles are kept while the inflation is at most 1 + share x (block_t - 1) / 2. Re-measured on the
# H200 with the kernels of 2026-12-01 (the pipelined tiles), 57 prefill cases timed on both paths
# (results/h200/selection-next/; `python benchmarks/probes/selection_check.py` on its bench.json prints
# every case). The break-even inflation lies, for 4-token tiles: scalar between 1.90 (tiles 0.78x
# the per-token time) and 3.73 (1.47x); bf16 (`none`) between 1.90 (0.59x) and 3.73 (1.10x);
# per_token_head between 1.90 (0.77x) and 3.73 (1.50x); for 8-token tiles (GQA 8): scalar between
# 2.20 (0.52x) and 7.17 (1.41x), bf16 between 2.20 (0.71x) and 7.17 (1.90x). A share of 1.0 lies
# inside every bracket; the smaller shares of the earlier kernels (bf16 0.5, per_token_head 0.3)
# sent five of these cases to the slower per-token path (up to 1.7x slower).
TILE_WASTE_SHARE = {"scalar": 1.0, "none": 1.0, "per_token_head": 1.0}


# The largest tile the estimate samples: its cost grows with the square of a tile's listings (the
# decision kernel compares each listing with every other), and a 16-token tile took it from ~20 to
# ~430 us on the H200 (results/h200/prefill-ws). Larger tiles are judged by the inflation and
# threshold of 8-token tiles. (The Gluon tile's 16-token tiles decide in their plan launch instead.)
MAX_SAMPLED_BLOCK_T = 8


# Short prefills decided on the host. For a few to a few hundred new tokens per request (chunked-
# prefill tails, multi-turn appends, speculative verification) `auto`'s device decision and the
# emptied launch of the path not taken cost more than the work, and the per-token walk is as fast as
# the tiles even on correlated selections (H200, 64 tokens after 8k, TP1 random: auto 141 us, tiled
# 136, per_token 56; issue 37). Inside this region `auto` with the table's configs (config=None)
# plans the per-token launch alone (the table's per-token config: what selection="per_token" runs),
# one launch and no decision; outside it, the device decides as above.
#
# PER_TOKEN_UP_TO[arch][(scale_mode, num_q_heads, num_kv_heads)] = ((max_requests, max_query_len), ...):
# a call of n requests (cu_seqlens_q.shape[0] - 1) takes the bucket with the smallest max_requests >= n,
# and the per-token walk when its max_query_len is at most that bucket's. More requests than the largest
# bucket, or an arch or (scale_mode, head layout) missing here: no host rule (the device decides). Keyed
# by the head layout, not by gqa: TP1 (64/4) and TP4 (16/1) share a gqa of 16 but not their break-even
# (1 request: TP1 up to 64 tokens, TP4 128 scalar and 256 per_token_head), and a layout never measured
# keeps the device decision rather than borrowing another's bound.
# The numbers come from the break-even run (on the GPU: `python benchmarks/bench.py --grid
# short-appends --out DIR`, then `python benchmarks/break_even.py DIR/bench.json`, which prints
# these entries). Its rule: a bucket (R, L) is measured at R requests, and L is the largest query
# length such that on every case of that scale mode and head layout at R requests with query length
# <= L (every prefix, both selection patterns) the per-token time is at most 1.05 x min(tiled, auto).
# gfx942 was never measured (it keeps the device decision).
# Measured: results/h200/ws-ratios-pdl/call2_short_before.json (2026-12-03, H200, 396 cases, the
# per_token_head tables re-tuned for its column-scaled walk, `auto` the device decision everywhere:
# bench.py --no-host-rule; break_even.txt there); each bucket's comment names the case that stopped it.
# A bucket of 0 keeps the device decision.
PER_TOKEN_UP_TO: dict[str, dict[tuple[str, int, int], tuple[tuple[int, int], ...]]] = {
    "sm90": {
        # scalar, 64/4 heads (tp1):
        #   1 request: up to 64 (128: tp1 scalar correlated 1x128 prefix1k, per_token 1.47x min(tiled, auto))
        #   4 requests: up to 16 (32: tp1 scalar correlated 4x32 prefix1k, per_token 1.47x min(tiled, auto))
        #   16 requests: up to 0 (16: tp1 scalar correlated 16x16 prefix1k, per_token 2.61x min(tiled, auto))
        ("scalar", 64, 4): ((1, 64), (4, 16), (16, 0)),
        # scalar, 16/1 heads (tp4):
        #   1 request: up to 128 (256: tp4 scalar correlated 1x256 prefix1k, per_token 1.31x min(tiled, auto))
        #   4 requests: up to 32 (64: tp4 scalar correlated 4x64 prefix1k, per_token 1.32x min(tiled, auto))
        #   16 requests: up to 0 (16: tp4 scalar correlated 16x16 prefix1k, per_token 1.32x min(tiled, auto))
        ("scalar", 16, 1): ((1, 128), (4, 32), (16, 0)),
        # scalar, 8/1 heads (tp8):
        #   1 request: up to 128 (256: tp8 scalar correlated 1x256 prefix1k, per_token 1.29x min(tiled, auto))
        #   4 requests: up to 32 (64: tp8 scalar correlated 4x64 prefix1k, per_token 1.29x min(tiled, auto))
        #   16 requests: up to 0 (16: tp8 scalar correlated 16x16 prefix1k, per_token 1.29x min(tiled, auto))
        ("scalar", 8, 1): ((1, 128), (4, 32), (16, 0)),
        # per_token_head, 64/4 heads (tp1):
        #   1 request: up to 64 (128: tp1 per_token_head correlated 1x128 prefix1k, per_token 1.83x min(tiled, auto))
        #   4 requests: up to 16 (32: tp1 per_token_head correlated 4x32 prefix1k, per_token 1.83x min(tiled, auto))
        #   16 requests: up to 0 (16: tp1 per_token_head correlated 16x16 prefix1k, per_token 2.91x min(tiled, auto))
        ("per_token_head", 64, 4): ((1, 64), (4, 16), (16, 0)),
        # per_token_head, 16/1 heads (tp4):
        #   1 request: up to 256 (512: tp4 per_token_head correlated 1x512 prefix8k, per_token 1.76x min(tiled, auto))
        #   4 requests: up to 64 (128: tp4 per_token_head correlated 4x128 prefix1k, per_token 1.98x min(tiled, auto))
        #   16 requests: up to 16 (32: tp4 per_token_head correlated 16x32 prefix1k, per_token 1.99x min(tiled, auto))
        ("per_token_head", 16, 1): ((1, 256), (4, 64), (16, 16)),
        # per_token_head, 8/1 heads (tp8):
        #   1 request: up to 256 (512: tp8 per_token_head correlated 1x512 prefix1k, per_token 1.88x min(tiled, auto))
        #   4 requests: up to 64 (128: tp8 per_token_head correlated 4x128 prefix1k, per_token 2.03x min(tiled, auto))
        #   16 requests: up to 16 (32: tp8 per_token_head correlated 16x32 prefix1k, per_token 2.05x min(tiled, auto))
        ("per_token_head", 8, 1): ((1, 256), (4, 64), (16, 16)),
    },
}


def per_token_on_host(arch: str, scale_mode: str, num_q_heads: int, num_kv_heads: int, num_requests: int,
                      max_query_len: int) -> bool:
    """True when `auto` takes the per-token walk on the host for this call shape (PER_TOKEN_UP_TO);
    False: no host rule, the device decides."""
    get_arch(arch)
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode: expected one of {SCALE_MODES}, got {scale_mode!r}")
    check_int("num_q_heads", num_q_heads, minimum=1)
    check_int("num_kv_heads", num_kv_heads, minimum=1)
    check_int("num_requests", num_requests, minimum=0)
    check_int("max_query_len", max_query_len, minimum=0)
    return inside_buckets(PER_TOKEN_UP_TO.get(arch, {}).get((scale_mode, num_q_heads, num_kv_heads), ()),
                          num_requests, max_query_len)


def tiles_on_host(max_seq_len: int | None, topk: int) -> bool:
    """True when `auto` can take the tiles on the host: a caller-given bound on every request's length
    (prefix + new tokens) of at most topk pages. Then every token has at most topk causal blocks and
    reads the first min(topk, causal blocks) entries of its row, which the indexer fills with all of
    them: neighbouring tokens read the same pages, and a tile reads its last token's pages, at most one
    more than its first token's (where it crosses a block boundary). On the H200 (short-appends after a 1k prefix,
    results/h200/ws-ratios-pdl's 396 cases), outside the per-token region the tiles were within 5% of
    the faster path in 70 of 70 such calls, and the device decision cost 1.12x the tiles (geomean; up to
    1.62x). Only the path depends on it, never the result: a wrong bound costs speed. None: no bound."""
    check_int("topk", topk, minimum=1)
    return max_seq_len is not None and max_seq_len <= topk * PAGE_SIZE


def inside_buckets(buckets, num_requests: int, max_query_len: int) -> bool:
    """Whether a call falls in a layout's buckets ((max_requests, max_query_len), ...): the bucket with
    the smallest max_requests >= num_requests holds it when max_query_len is at most its bound."""
    for max_requests, up_to in sorted(buckets):
        if num_requests <= max_requests:
            return max_query_len <= up_to
    return False


# Short calls: the threshold above is measured on calls whose tiles fill every SM. When a call's
# tiles are fewer than the SMs, each tile's pages are the critical path and the per-token walk's
# programs (block_t times as many) spread the same picks over more SMs; the tiles then pay off only
# below a smaller inflation. Model: each path takes max(1, programs / SMs) waves of its programs'
# steps, a tile's steps being `inflation` times a token's; the threshold keeps its value where both
# paths fill the GPU and scales by (per-token waves / tile waves) / block_t below that. On the H200's
# short-prefill grid (results/h200/short-appends, 396 cases; CPU check: benchmarks/probes/
# selection_check.py) the device's pick was more than 5% slower than the faster path in 101 cases
# (worst 4.0x: TP1 random 32 tokens after 8k) with the threshold alone, in 6 (worst 1.14x,
# per_token_head) with this factor at the H200's 132 SMs. An SM count of 66 or 264 instead gave 39
# and 37: the count is the device's own, not a fitted constant. gfx942 takes its CU count, unmeasured.


def fill_factor(total_q: int, num_kv_heads: int, block_t: int, sm_count: int | None) -> float:
    """How much of the tiles' inflation threshold a call keeps (1.0 when its tiles fill every SM, or
    when the SM count is not known: the interpreter). total_q tokens in block_t-token tiles; a call
    of several requests has a few more tiles than total_q / block_t, which this leaves out."""
    check_int("total_q", total_q, minimum=0)
    check_int("num_kv_heads", num_kv_heads, minimum=1)
    check_int("block_t", block_t, minimum=1)
    if sm_count is None or total_q == 0:
        return 1.0
    check_int("sm_count", sm_count, minimum=1)
    tile_waves = max(1.0, -(-total_q // block_t) * num_kv_heads / sm_count)
    token_waves = max(1.0, total_q * num_kv_heads / sm_count)
    return min(1.0, token_waves / tile_waves / block_t)


def sampled_block_t(block_t: int) -> int:
    """The tile size whose inflation `auto` estimates for tiles of block_t tokens."""
    return min(block_t, MAX_SAMPLED_BLOCK_T)


def auto_threshold(block_t: int, scale_mode: str, *, gluon: bool, total_q: int, num_kv_heads: int,
                   sm_count: int | None) -> tuple[int, float]:
    """What `auto` judges for a call's tiles of block_t tokens: (the tile size whose inflation it
    measures, the inflation up to which it keeps the tiles). The Gluon tile's plan launch counts its
    own tiles; the Triton tiles' decision samples tiles of sampled_block_t. The threshold is
    tiles_pay_off_below at that size, times the call's fill_factor."""
    judged = block_t if gluon else sampled_block_t(block_t)
    return judged, tiles_pay_off_below(judged, scale_mode) * fill_factor(total_q, num_kv_heads, block_t, sm_count)


def tiles_pay_off_below(block_t: int, scale_mode: str) -> float:
    """The tile inflation up to which block_t tiles are kept for a scale mode (see TILE_WASTE_SHARE):
    2.5 for 4 tokens and 4.5 for 8 in every mode."""
    if scale_mode not in TILE_WASTE_SHARE:
        raise ValueError(f"scale_mode: expected one of {sorted(TILE_WASTE_SHARE)}, got {scale_mode!r}")
    return 1 + TILE_WASTE_SHARE[scale_mode] * (block_t - 1) / 2


def _token_positions(cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor, tokens: torch.Tensor):
    """(request, position) of flat query tokens, on the device (no host sync)."""
    cu = cu_seqlens_q.long()
    req = torch.searchsorted(cu[1:], tokens, right=True).clamp(max=cu.numel() - 2)
    return req, prefix_lens.long()[req] + tokens - cu[req]


def tile_inflation(topk_idx: torch.Tensor, block_t: int, cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor,
                   sampled_tiles: int = SAMPLED_TILES) -> torch.Tensor:
    """Distinct pages per tile of block_t consecutive tokens over the pages one token picks, as a
    0-d float32 tensor on topk_idx's device: 1.0 when a tile's tokens share every page, block_t
    when they share none. A pick is what the kernels load: one of a token's first
    min(topk, p // 128 + 1) entries (p its position) naming a block in [0, p // 128]; the
    entries past those are never read. Tiles are taken over the flat token order; a tile that
    straddles two requests counts their ids as distinct pages."""
    if block_t < 2:
        raise ValueError(f"block_t: a tile has at least 2 tokens, got {block_t}")
    num_kv_heads, total_q, topk = topk_idx.shape
    num_tiles = total_q // block_t
    device = topk_idx.device
    if num_tiles == 0 or cu_seqlens_q.numel() < 2:
        return torch.ones((), dtype=torch.float32, device=device)
    samples = min(sampled_tiles, num_tiles)
    starts = torch.arange(samples, device=device) * num_tiles // samples * block_t
    tokens = (starts[:, None] + torch.arange(block_t, device=device)[None, :]).reshape(-1)
    req, pos = _token_positions(cu_seqlens_q, prefix_lens, tokens)
    ids = topk_idx[:, tokens, :].long()  # [Hkv, tokens, topk]
    picked = read_mask(pos + 1, topk)[None] & (ids >= 0) & (ids <= (pos // PAGE_SIZE)[None, :, None])
    # A page is (request, block): the same id in two requests is two pages. -1 marks a non-pick.
    keys = torch.where(picked, req[None, :, None] * (1 << 32) + ids, -1)
    keys = keys.reshape(num_kv_heads * samples, block_t * topk).sort(dim=-1).values
    valid = keys >= 0
    first = torch.ones_like(valid)
    first[:, 1:] = keys[:, 1:] != keys[:, :-1]
    # (distinct pages per tile) / (picks per token), both over the same sampled tiles.
    distinct = (valid & first).sum().to(torch.float32)
    picks = valid.sum().to(torch.float32)
    return distinct * block_t / picks.clamp(min=1.0)


def split_seqlens(cu_seqlens_q: torch.Tensor, use_tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens for the tiled launch, for the per-token launch): the chosen path keeps the real
    offsets, the other one gets zeros (every request empty)."""
    keep = use_tiles.to(cu_seqlens_q.dtype)
    return cu_seqlens_q * keep, cu_seqlens_q * (1 - keep)


def choose_tiles(topk_idx: torch.Tensor, block_t: int, scale_mode: str, cu_seqlens_q: torch.Tensor,
                 prefix_lens: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor on the device: True when block_t tiles should run (judged at sampled_block_t)."""
    sampled_t = sampled_block_t(block_t)
    return tile_inflation(topk_idx, sampled_t, cu_seqlens_q, prefix_lens) <= tiles_pay_off_below(sampled_t, scale_mode)
