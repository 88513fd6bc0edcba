"""Is the page loop software-pipelined? Counts the asynchronous copies (cp.async) in the sm90 PTX
of each kernel path at num_stages 1 and 3: with a pipelined loop, stages > 1 prefetch the next K/V
slices through shared memory; without, num_stages changes nothing. Compiles ahead of time on the
CPU (no GPU); run it with the Triton the GPU uses:

  .venv-static/bin/python benchmarks/ptx_pipelining.py
"""
from __future__ import annotations

import pathlib
import re
import sys

import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from ptx_conversions import ptx_of  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402

PATHS = {
    "prefill, 4-token tiles": ("prefill", dict(block_t=4, block_n=64, kv_upcast=2)),
    "prefill, per token": ("prefill", dict(block_t=1, block_n=64)),
    "decode split": ("decode", dict(num_splits=1, block_n=64)),
}


if __name__ == "__main__":
    print(f"triton {triton.__version__}, sm90, scalar scales, fp8 cache, 64 q heads / 4 KV heads")
    print(f"{'path':<24} {'stages':>6} {'cp.async':>9} {'PTX lines':>10}")
    for name, (kernel, fields) in PATHS.items():
        for stages in (1, 3):
            ptx = ptx_of(kernel, LaunchConfig(**fields, num_stages=stages), heads=(64, 4))
            print(f"{name:<24} {stages:>6} {len(re.findall(r'cp[.]async[.]', ptx)):>9} {ptx.count(chr(10)):>10}")
