"""The accuracy gate shared by the tests, the tuner and the GPU checks."""
from __future__ import annotations

import dataclasses

import torch

# (max relative L2 error, max absolute error) against the float64 reference, by query dtype.
#  - float32: with fp32 queries every operand is fp32 (fp8/bf16 cache values upcast exactly), so a
#    correct kernel lands near 1e-7; 1e-5 leaves room for tf32-free accumulation order over 2048
#    keys and still catches any wrong key, scale or mask (those move the result by > 1e-2).
#  - bfloat16 / float16: the query, the upcast K/V and the probabilities are rounded to 8 (bf16) or
#    11 (fp16) mantissa bits before the tensor-core dots; measured 2e-3..5e-3 relative L2 on an H200
#    (msa-semantics.md), so 1e-2 / 5e-3 with max abs 4e-2 / 2e-2.
TOLERANCES = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (1e-2, 4e-2),
    torch.float16: (5e-3, 2e-2),
}


def gate_dtype(q_dtype: torch.dtype, config=None) -> torch.dtype:
    """The dtype whose tolerance judges a run: the query's, except that fp16 MMAs (a config with
    kv_upcast 2 or 3) round fp32 queries and probabilities to fp16 first."""
    if config is not None and getattr(config, "kv_upcast", 0) in (2, 3) and q_dtype == torch.float32:
        return torch.float16
    return q_dtype


@dataclasses.dataclass(frozen=True)
class Comparison:
    rel_l2: float
    max_abs: float
    unwritten: int  # NaN elements left from the poisoned output (or produced by the kernel)
    rel_tol: float
    abs_tol: float

    @property
    def ok(self) -> bool:
        return self.unwritten == 0 and self.rel_l2 <= self.rel_tol and self.max_abs <= self.abs_tol

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"{verdict}: rel_l2={self.rel_l2:.2e} (tol {self.rel_tol:.0e}), max_abs={self.max_abs:.2e} "
                f"(tol {self.abs_tol:.0e}), non-finite={self.unwritten}")


def compare(out: torch.Tensor, ref: torch.Tensor, q_dtype: torch.dtype | None = None) -> Comparison:
    rel_tol, abs_tol = TOLERANCES[q_dtype or out.dtype]
    # float64 on the output's device: on the CPU a large prefill bucket's compare took most of a
    # tuning trial (H200, TP4: 179 of 198 s of trials); only the four figures come back.
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(out64.device, torch.float64)
    unwritten = int((~torch.isfinite(out64)).sum())
    diff = torch.nan_to_num(out64 - ref64, nan=float("inf"))
    rel = float(diff.norm() / ref64.norm().clamp_min(1e-30)) if unwritten == 0 else float("inf")
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return Comparison(rel, max_abs, unwritten, rel_tol, abs_tol)
