"""How much MMA work a prefill tile of `block_t` tokens does per useful unit, on the selections the
tuner and the benchmark use (codegen.cases, CPU only, no kernel runs).

A tile walks the union of its tokens' selected pages and computes every row on each, so its MMA
work is (distinct pages in the tile) x block_t against the useful sum of every token's own picks.

  python benchmarks/tile_overlap.py          # 8k tokens, TP1 KV heads; correlated and random + 120k prefix
"""
from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import cases  # noqa: E402


def overlap(pattern: str, prefix: int, tokens: int = 8192, num_kv_heads: int = 4, block_ts=(2, 4, 8)) -> list[str]:
    case = cases.prefill_case(arch="sm90", q_lens=[tokens], prefix_lens=[prefix], num_q_heads=num_kv_heads,
                              num_kv_heads=num_kv_heads, head_dim=16, kv_dtype="fp8", scale_mode="scalar", seed=0,
                              pattern=pattern, compact=True)
    topk = case.args["topk_idx"]  # [Hkv, T, topk]
    heads, total, k = topk.shape
    lines = []
    for bt in block_ts:
        picks = distinct = 0
        for g in range(heads):
            for i in range(0, total - total % bt, bt):
                valid = topk[g, i:i + bt]
                valid = valid[valid >= 0]
                picks += valid.numel()
                distinct += torch.unique(valid).numel()
        tiles = heads * (total // bt)
        lines.append(f"{pattern} prefix {prefix // 1024}k block_t {bt}: distinct pages per tile "
                     f"{distinct / tiles:.1f} of {bt * k}; MMA work / useful = {distinct * bt / picks:.2f}")
    return lines


if __name__ == "__main__":
    for pattern, prefix in (("correlated", 0), ("random", 120 * 1024)):
        print("\n".join(overlap(pattern, prefix)))
