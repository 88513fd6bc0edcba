"""Per-call kernel time from one CUDA graph of many calls on rotating inputs.

A graph of a single call measures launch latency (about 9 us on an H200, even for an empty
kernel); a graph of N calls, each on its own input set, amortizes the launch and keeps one call's
data out of the next one's cache. Per-call time = replay time / N, median over replays.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Callable, Sequence

import torch
import triton
import triton.language as tl

L2_BYTES_H200 = 60 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    calls_per_graph: int
    replays: int


def device_l2_bytes() -> int:
    """The current GPU's L2 size (the H200's when torch does not report it)."""
    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", L2_BYTES_H200)


def input_sets(bytes_per_call: int, *, maximum: int = 20, l2_bytes: int | None = None) -> int:
    """Input sets to rotate so that consecutive calls never share the L2: together they stream at
    least four L2s of distinct data (at least 2 sets, at most `maximum`)."""
    l2_bytes = device_l2_bytes() if l2_bytes is None else l2_bytes
    return max(2, min(maximum, math.ceil(4 * l2_bytes / max(bytes_per_call, 1))))


def graph_time(calls: Sequence[Callable[[], object]], *, replays: int = 30, warmup_replays: int = 3,
               stream: torch.cuda.Stream | None = None) -> Timing:
    """Times the per-call cost of `calls` (each a closure over its own inputs) captured in one graph."""
    if not calls:
        raise ValueError("calls: expected at least one call to time")
    for call in calls[:2]:  # compile and warm up outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = stream or torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    for _ in range(warmup_replays):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = sorted(s.elapsed_time(e) * 1e3 / len(calls) for s, e in zip(starts, ends))
    del graph
    return Timing(
        median_us=statistics.median(per_call),
        p10_us=per_call[len(per_call) // 10],
        p90_us=per_call[(len(per_call) * 9) // 10],
        calls_per_graph=len(calls),
        replays=replays,
    )


def copy_bandwidth(num_bytes: int = 2 * 2 ** 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(3):
        dst.copy_(src)
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * num_bytes / statistics.median(times)


@triton.jit
def _one_store(ptr):
    tl.store(ptr + tl.program_id(0), 1)


def empty_launch_us(calls: int = 20) -> float:
    """Per-call time of a Triton kernel that only stores one int, timed like the kernels (one graph
    of `calls` calls, replay / calls, median): the floor under any one-launch call on this GPU."""
    buf = torch.zeros(1, dtype=torch.int32, device="cuda")
    return graph_time([lambda: _one_store[(1,)](buf) for _ in range(calls)]).median_us


def matmul_flops(n: int = 8192, repeats: int = 10) -> float:
    """Dense bf16 matmul rate in FLOP/s on random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n ** 3 / statistics.median(times)
