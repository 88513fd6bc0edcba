"""`selection="auto"` decided inside the Gluon tile's plan launch (templates/prefill_ws.py.jinja):
PlanDecision carries the buffers that launch writes its verdict into.

The Triton tiles need no such launch: each tile decides for itself from its own plan
(templates/prefill.py.jinja, VERDICTS; codegen.api). A separate decision launch that sampled tiles
(2026-11 to 2026-12-03) cost 3.9-14 us a call on the H200 (results/h200/auto-cost).
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class PlanDecision:
    """`auto` decided inside the Gluon tile's plan launch (templates/prefill_ws.py.jinja), which builds
    every tile's plan anyway: exact over all tiles, with no launch of its own. Its
    tensors: counters (>= 3 zeroed int32, put back to zero by the launch), the tiled and per-token
    launches' cu_seqlens (written by the launch), the inflation (float32, one element)."""
    counters: torch.Tensor
    tiled_cu: torch.Tensor
    per_token_cu: torch.Tensor
    inflation: torch.Tensor
    threshold: float

    @classmethod
    def for_call(cls, cu_seqlens_q: torch.Tensor, threshold: float, counters: torch.Tensor) -> "PlanDecision":
        return cls(counters, torch.empty_like(cu_seqlens_q), torch.empty_like(cu_seqlens_q),
                   torch.empty(1, dtype=torch.float32, device=cu_seqlens_q.device), float(threshold))
