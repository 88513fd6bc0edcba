"""Arrival counters of the fused decode merge: int32, zero between calls (the last split program
of each (token, KV head) resets its counter after merging), so one buffer per device serves every
call and graph replay made in stream order. Calls running concurrently on two streams of one
device would share counters: give each its own with `arrival_counters(..., key=...)`."""
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
