"""The call shapes this project serves, tunes and gates, each named once: dtypes by name, head
layouts, (scale mode, KV dtype) pairs, token buckets.

It sits below the runtime and below both clients of a launch description, the tuner
(codegen.tuning) and the static gate (codegen.static), so none of them imports another for a
constant.
"""
from __future__ import annotations

import torch

from .variants import get_arch

# A KV cache's dtype by name; "fp8" is the arch's own fp8 type (ArchSpec.fp8_dtype).
KV_DTYPES = ("fp8", "bf16", "fp16")
# Every other dtype a kernel argument may have, by the name tables, reports and tests use.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_dtype(arch: str, name: str) -> torch.dtype:
    """The torch dtype of a dtype name on `arch` ("fp8" is the arch's fp8 type)."""
    if name == "fp8":
        return get_arch(arch).fp8_dtype
    if name not in DTYPES:
        raise ValueError(f"dtype: expected 'fp8' or one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


# (q heads, KV heads) of MiniMax-M3's attention per GPU at each tensor-parallel degree.
HEAD_LAYOUTS = {"tp1": (64, 4), "tp2": (32, 2), "tp4": (16, 1), "tp8": (8, 1)}
# The layouts MiniMax-M3 serves with: the tuner's default grid, the benchmark, the static gates
# and the GPU tests.
DEFAULT_LAYOUTS = ("tp1", "tp4", "tp8")
SERVING_LAYOUTS = {name: HEAD_LAYOUTS[name] for name in DEFAULT_LAYOUTS}
# (scale mode, KV dtype) pairs a serving deployment runs: fp8 caches with either scale mode, bf16 without.
DEFAULT_MODES = (("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16"))
# Decode query tokens in a batch (requests x query length): 512 is 128 requests of 4 tokens (speculative
# decoding), which took a 256-token config tuned for single tokens, 1.2-1.3x slower (results/h200/decode-retune-vcvt).
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PREFILL_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768)  # tokens in one chunk
