"""Call plans: what a call's launches depend on, worked out once per call shape and reused.

A serving engine calls the attention once per layer per step, 60+ times with tensors of the same
shapes and the same metadata. Everything but the tensors' data is the same across those calls:
the validated layout, the config, the grid, the strides, the compiled kernels, the buffers. A
`CallPlan` holds all of it; a later call only looks its plan up and fills the tensors in.

Building a plan (on the first call of a key): the API validates the arguments and resolves the
config as before; the generated modules then *record* their launches (`launch(..., record=...)`)
instead of running them, on fresh views of the call's tensors, so that each launch argument is
known to be the query, the cache, a stride (an int), a buffer the launch allocated (owned by the
plan from then on) or a TMA descriptor over the cache. Each launch is bound to its compiled
kernel (codegen.bound_launch) and run once: that is the call's own result.

The key (`call_key`) holds what any of that depends on: each tensor's shape, strides, dtype,
device and 16-byte alignment (Triton specializes pointers on it, TMA needs it), every scalar
argument with its type, the arch, config and options given, the current device and stream.
Per-stream plans give each stream its own buffers (split-K partials, arrival counters), so calls
in flight on two streams never share them. The tuned-table file a plan's config came from is
stat'ed on every call (`PlanCache.get`): a re-tune written under a running server is picked up.
Inside a CUDA graph capture no plan is kept or reused: the capture builds its launches itself, its
partials from the graph's memory and its arrival counters the device's shared buffer, made by the
eager calls before it (codegen.workspace.call_counters).

`StepPlan` (codegen.api.plan_prefill / plan_decode) is the explicit form for engines that know
their steps: a step's metadata once, then only the layer's tensors per call.
"""
from __future__ import annotations

import torch

from .loader import TableStamp

MAX_PLANS = 256  # distinct call shapes kept (a server sees a few dozen: batch sizes x layouts)
# Device memory the kept plans may own (split-K partials, counters): a decode plan of 512 tokens at
# TP1 with 16 splits owns 134 MB, and a tuner's process meets hundreds of configs.
MAX_PLAN_BYTES = 1 << 30


def _cuda_state():
    """(current device, its current stream's handle, whether that stream is capturing)."""
    device = torch.cuda.current_device()
    return device, torch.cuda.current_stream(device).cuda_stream, torch.cuda.is_current_stream_capturing()


try:  # the same three facts through the C functions those wrappers call: a few hundred ns less
    from torch._C import _cuda_getCurrentRawStream, _cuda_getDevice, _cuda_isCurrentStreamCapturing

    def _cuda_state():  # noqa: F811
        device = _cuda_getDevice()
        return device, _cuda_getCurrentRawStream(device), _cuda_isCurrentStreamCapturing()
except ImportError:  # pragma: no cover - older or newer torch
    pass


def device_state(q) -> tuple[int, int, bool]:
    """(current device, its current stream, whether the stream is capturing a graph) for a call
    on q's device; (-1, 0, False) on the CPU (the interpreter)."""
    return _cuda_state() if q.is_cuda else (-1, 0, False)


LAYER_TENSORS = 6  # a call's tensors: its layer's (q, cache, top-k, output, scales) first, then the step's


def signatures(tensors, pointers) -> list:
    """What a compiled launch depends on in each tensor besides its data, None kept: shape, strides,
    dtype, device and whether its address (`pointers`) is 16-byte aligned. The device with its type:
    get_device() is -1 for CPU and meta tensors alike, and a meta tensor must reach validation."""
    return [None if t is None else (t.shape, t.stride(), t.dtype, t.device, p & 15)
            for t, p in zip(tensors, pointers)]


def call_key(family: str, tensors: tuple, scalars: tuple, options: tuple):
    """(key, cacheable, stream, pointers) of a call. key: what its plan depends on (None when an
    argument is not a tensor where one is expected: validation then names it); cacheable: False
    inside a graph capture; stream: the current stream's handle; pointers: each tensor's address
    (0 for None), which the bound launches pass as they are (an int skips the launcher's
    data_ptr() call and pointer query per argument: validation checked the devices).

    The step's metadata tensors are the same objects in every layer's call: their signatures are
    remembered with the objects, their version counters (bumped by every in-place change, a resize
    or restride included) and addresses, and reused while all three match."""
    try:
        pointers = [0 if t is None else t.data_ptr() for t in tensors]
        sigs = signatures(tensors[:LAYER_TENSORS], pointers)
        step = tensors[LAYER_TENSORS:]  # four of them in both families (None where absent)
        versions = [None if t is None else t._version for t in step]
        memo = _step_memo.get(family)
        if memo is not None:
            seen = memo[0]
        if (memo is not None and step[0] is seen[0] and step[1] is seen[1] and step[2] is seen[2]
                and step[3] is seen[3] and memo[1] == versions and memo[2] == pointers[LAYER_TENSORS:]):
            step_sigs = memo[3]
        else:
            step_sigs = tuple(signatures(step, pointers[LAYER_TENSORS:]))
            _step_memo[family] = (step, versions, pointers[LAYER_TENSORS:], step_sigs)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, or tensors without storage: validation speaks
        return None, False, 0, None
    device, stream, capturing = device_state(tensors[0])
    # Types with the values: True == 1 and hashes like it, but only one of them passes validation.
    key = (family, *sigs, step_sigs, *[(type(s), s) for s in scalars],
           *[("dict", tuple(o.items())) if type(o) is dict else (type(o), o) for o in options], device, stream)
    return key, not capturing, stream, pointers


_step_memo: dict = {}  # family -> (the last call's step tensors, their versions, addresses, signatures)


class PlanCache:
    """Plans by key, the oldest dropped past MAX_PLANS plans or MAX_PLAN_BYTES of buffers they own.
    Lookups and inserts are single dict operations (atomic under the GIL); two threads building the
    same plan both succeed."""

    def __init__(self, limit: int = MAX_PLANS, max_bytes: int = MAX_PLAN_BYTES):
        self.limit, self.max_bytes = limit, max_bytes
        self._plans: dict = {}

    def get(self, key):
        try:
            plan = self._plans.get(key)
        except TypeError:  # an unhashable argument (a list as a config, say): validation names it
            return None
        if plan is None or plan.fresh():
            return plan
        self._plans.pop(key, None)
        return None

    def put(self, key, plan) -> None:
        if key is None:
            return
        try:
            hash(key)
        except TypeError:
            return
        while self._plans and (len(self._plans) >= self.limit
                               or self.owned_bytes() + plan.nbytes > self.max_bytes):
            self._plans.pop(next(iter(self._plans)), None)
        self._plans[key] = plan

    def owned_bytes(self) -> int:
        return sum(plan.nbytes for plan in list(self._plans.values()))

    def clear(self) -> None:
        self._plans.clear()

    def snapshot(self) -> dict:
        """The kept plans, to `restore` after work whose plans should not stay (a warm-up's)."""
        return dict(self._plans)

    def restore(self, plans: dict) -> None:
        self._plans = dict(plans)

    def __len__(self) -> int:
        return len(self._plans)


PLANS = PlanCache()


def forget_plans() -> None:
    """Drops every kept plan and the last step's tensors: their buffers may sit inside allocator
    segments of freed inputs and keep those reserved (the tuner's preparers, giving back large inputs)."""
    PLANS.clear()
    _step_memo.clear()


def views(tensors: tuple) -> tuple:
    """A fresh view of each tensor (same memory, shape and strides), None kept: recorded launch
    arguments are matched to the call's tensors by identity, which must be unique even when a
    caller passes one tensor in two roles."""
    return tuple(None if t is None else t[...] for t in tensors)


class CallPlan:
    """The bound launches of one call shape (which hold the buffers they allocated) and what keeps
    them valid."""

    __slots__ = ("launches", "calls", "stamp", "config", "nbytes")

    def __init__(self, launches, *, stamp: TableStamp | None, config):
        self.launches = launches
        owned = {t.data_ptr(): t.untyped_storage().nbytes() for launch in launches for t in launch.args
                 if isinstance(t, torch.Tensor)}
        self.nbytes = sum(owned.values())  # the buffers its launches allocated (call tensors are not kept)
        self.calls = tuple(launch.fast or launch for launch in launches)
        self.stamp = stamp  # the tuned-table file the config came from (None: the config was given)
        self.config = config

    def fresh(self) -> bool:
        return self.stamp is None or self.stamp.unchanged()

    def run(self, tensors: tuple, pointers: list, stream: int) -> None:
        for call in self.calls:
            call(tensors, pointers, stream)


class StepPlan:
    """One step's calls, planned once and run per layer: FlashInfer's plan/run split for engines
    that know their step boundaries. Made by codegen.api.plan_prefill / plan_decode from the
    step's metadata; `run(q, kv_cache, topk_idx, output, k_scale=None, v_scale=None)` per layer.

    run() computes only the layer tensors' signatures (shape, strides, dtype, device, alignment)
    and looks the call plan up among those this step plan has used: the metadata, scalars and
    options were fixed when it was made, and the tuned table was read when a layer layout first
    ran. A step plan is meant for one step (make one per step, as with FlashInfer; the metadata
    tensors must not be resized while it is used). A layout it has not run yet goes through the
    drop-in function, which validates the whole call first."""

    __slots__ = ("family", "step", "scalars", "options", "drop_in", "step_pointers", "_plans")

    def __init__(self, family: str, step: tuple, scalars: tuple, options: tuple, drop_in):
        self.family, self.step, self.scalars, self.options, self.drop_in = family, step, scalars, options, drop_in
        self._plans: dict = {}
        try:
            self.step_pointers = [0 if t is None else t.data_ptr() for t in step]
        except (AttributeError, TypeError, RuntimeError):  # run() goes through the drop-in, which names it
            self.step_pointers = None

    def run(self, q, kv_cache, topk_idx, output, k_scale=None, v_scale=None):
        """Attention of one layer of the step into `output`; returns it."""
        layer = (q, kv_cache, topk_idx, output, k_scale, v_scale)
        try:
            pointers = [0 if t is None else t.data_ptr() for t in layer]
            device, stream, capturing = device_state(q)
            key = (*signatures(layer, pointers), device, stream)
            plan = None if capturing else self._plans.get(key)
        except (AttributeError, TypeError, RuntimeError):
            key, capturing, plan = None, True, None
        if plan is not None and self.step_pointers is not None:
            plan.run(layer + self.step, pointers + self.step_pointers, stream)
            return output
        self.drop_in(layer)  # validates, builds or finds the call plan, runs
        if not capturing:
            full_key, cacheable, _, _ = call_key(self.family, layer + self.step, self.scalars, self.options)
            found = PLANS.get(full_key) if cacheable else None
            if found is not None:
                self._plans[key] = found
        return output
