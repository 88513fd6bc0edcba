"""How much MMA work a prefill tile of `block_t` tokens does per useful unit, on the selections the
tuner and the benchmark use (codegen.cases, CPU only, no kernel runs).

A tile walks the union of its tokens' selected pages and computes every row on each, so its MMA
work is (distinct pages in the tile) x block_t against the useful sum of every token's own picks:
codegen.selection.tile_inflation over every tile (the estimate `selection="auto"` samples).

  python benchmarks/tile_overlap.py          # 8k tokens, TP1 KV heads; correlated and random + 120k prefix
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from codegen import cases  # noqa: E402
from codegen.reference import read_mask  # noqa: E402
from codegen.selection import tile_inflation  # noqa: E402
from codegen.variants import PAGE_SIZE  # noqa: E402


def overlap(pattern: str, prefix: int, tokens: int = 8192, num_kv_heads: int = 4, block_ts=(2, 4, 8)) -> list[str]:
    case = cases.prefill_case(arch="sm90", q_lens=[tokens], prefix_lens=[prefix], num_q_heads=num_kv_heads,
                              num_kv_heads=num_kv_heads, head_dim=16, kv_dtype="fp8", scale_mode="scalar", seed=0,
                              pattern=pattern, compact=True)
    topk = case.args["topk_idx"]  # [Hkv, T, topk]
    heads, total, k = topk.shape
    # The entries a token reads (its first min(k, p // 128 + 1)) that name a block it may see.
    pos = prefix + torch.arange(total)
    own = (pos // PAGE_SIZE)[None, :, None]
    picks = read_mask(pos + 1, k)[None] & (topk >= 0) & (topk <= own)
    lines = []
    for bt in block_ts:
        tiles = total // bt
        # every full tile, as auto's estimate counts
        work = tile_inflation(topk, bt, case.args["cu_seqlens_q"], case.args["prefix_lens"], sampled_tiles=tiles).item()
        picks_per_token = picks[:, :tiles * bt].sum().item() / (heads * tiles * bt)
        lines.append(f"{pattern} prefix {prefix // 1024}k block_t {bt}: distinct pages per tile "
                     f"{work * picks_per_token:.1f} of {bt * k}; MMA work / useful = {work:.2f}")
    return lines


if __name__ == "__main__":
    for pattern, prefix in (("correlated", 0), ("random", 120 * 1024)):
        print("\n".join(overlap(pattern, prefix)))
