"""Counts the conversion and MMA instructions in the sm90 PTX of the generated kernels, per
`kv_upcast` mode: the evidence for what each fp8 upcast path costs. Compiles ahead of time on the
CPU (no GPU); run it with the Triton the GPU uses:

  .venv-static/bin/python benchmarks/ptx_conversions.py
"""
from __future__ import annotations

import collections
import pathlib
import re
import sys

import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import static  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402

CASES = {
    "decode": [dict(num_splits=1, kv_upcast=u) for u in (0, 1, 2)],
    "prefill": [dict(block_t=4, block_n=128, kv_upcast=u) for u in (0, 1, 2)],
}


def ptx_of(kernel: str, config: LaunchConfig, scale_mode: str = "scalar", heads=(16, 1)) -> str:
    return static.compile_asm(static.launches_for("sm90", kernel, scale_mode, "fp8", *heads, config)[0])


if __name__ == "__main__":
    print(f"triton {triton.__version__}, sm90, scalar scales, fp8 cache, 16 q heads / 1 KV head")
    for kernel, configs in CASES.items():
        for fields in configs:
            ptx = ptx_of(kernel, LaunchConfig(**fields))
            cvts = collections.Counter(re.findall(r"\bcvt\.[a-z0-9.]+", ptx))
            mma = len(re.findall(r"wgmma\.mma_async|mma\.sync", ptx))
            fp_cvts = {k: v for k, v in cvts.most_common() if any(t in k for t in ("e4m3", "bf16", "f16", "f32"))}
            print(f"{kernel} {fields}: mma {mma}, conversions {fp_cvts}")
