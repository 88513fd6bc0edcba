"""Is the page loop software-pipelined? Counts the asynchronous copies (cp.async) in the sm90 PTX
of each kernel path at num_stages 1 and 3: with a pipelined loop, stages > 1 prefetch the next K/V
slices through shared memory; without, num_stages changes nothing. Compiles ahead of time on the
CPU (no GPU); run it with the Triton the GPU uses:

  .venv-static/bin/python benchmarks/ptx_pipelining.py

tests/static/test_static_gates.py::test_page_loops_prefetch keeps the same facts as a gate.
"""
from __future__ import annotations

import pathlib
import sys

import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from codegen import static  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402

PATHS = {
    "prefill, 4-token tiles": ("prefill", dict(block_t=4, block_n=64, kv_upcast=2)),
    "prefill, per token": ("prefill", dict(block_t=1, block_n=64)),
    "decode split": ("decode", dict(num_splits=1, block_n=64)),
}


def async_copies(kernel: str, fields: dict, num_stages: int, heads=(64, 4)) -> tuple[int, int]:
    """(cp.async instructions, PTX lines) of the path's first kernel, scalar scales on an fp8 cache."""
    config = LaunchConfig(**fields, num_stages=num_stages)
    ptx = static.compile_asm(static.launches_for("sm90", kernel, "scalar", "fp8", *heads, config)[0])
    return static.async_copies(ptx), ptx.count("\n")


if __name__ == "__main__":
    print(f"triton {triton.__version__}, sm90, scalar scales, fp8 cache, 64 q heads / 4 KV heads")
    print(f"{'path':<24} {'stages':>6} {'cp.async':>9} {'PTX lines':>10}")
    for name, (kernel, fields) in PATHS.items():
        for stages in (1, 3):
            copies, lines = async_copies(kernel, fields, stages)
            print(f"{name:<24} {stages:>6} {copies:>9} {lines:>10}")
