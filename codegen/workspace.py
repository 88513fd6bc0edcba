"""Arrival counters of the fused decode merge and of prefill's `auto` decision: int32, zero between
calls (the last program to arrive resets them), so one buffer serves every call made in stream
order. Eager calls get their plan's own (codegen.plan keys plans by stream, so calls in flight on
two streams never share them); calls captured into a CUDA graph share one buffer per device, made
by the eager calls before the capture, as a capture cannot allocate zeroed memory without a
zeroing node in the graph (a fill kernel per call: +1.1-1.5 us per decode call measured on the
H200). Two graphs replayed at once on two streams would share it: give them eager calls of their
own shapes first, or no fused merge."""
from __future__ import annotations

import torch

_buffers: dict = {}
# Every buffer ever handed out stays allocated: a CUDA graph captured with a smaller one keeps
# writing to it on replay after a larger call has replaced it here.
_retired: list = []


def arrival_counters(device: torch.device, count: int, key=None) -> torch.Tensor:
    """At least `count` zeroed int32 counters on `device`. Grows (a new zeroed buffer) when too small.
    Inside a CUDA graph capture a missing or too small buffer is allocated by the capture and not
    kept: its zeroing is captured with it, so every replay starts from zeros."""
    slot = (device.type, device.index, key)
    buf = _buffers.get(slot)
    if buf is not None and buf.numel() >= count:
        return buf
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    fresh = torch.zeros(max(count, 1024 if buf is None else 2 * buf.numel()), dtype=torch.int32, device=device)
    if not capturing:
        if buf is not None:
            _retired.append(buf)
        _buffers[slot] = fresh
    return fresh


def call_counters(device: torch.device, count: int, capturing: bool, key=None) -> torch.Tensor:
    """Zeroed counters for one call plan: its own buffer for an eager plan (and the device's shared
    one made ready for later captures), the device's shared one inside a graph capture."""
    if capturing:
        return arrival_counters(device, count, key)
    arrival_counters(device, count, key)
    return torch.zeros(count, dtype=torch.int32, device=device)
