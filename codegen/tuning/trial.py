"""Runs inside a trial worker process: build a bucket's inputs once, then check and time configs.

Every trial: the output is poisoned (NaN), the config runs on an accuracy input set separate from
the timing sets, and must match the reference within codegen.accuracy's gate; then it is timed as
the benchmark times (one CUDA graph of several calls cycling over rotating input sets, replay
time / calls, median). Under the interpreter (CPU tests) the timing is a wall clock over one call:
meaningless as a speed, kept only so the pipeline runs end to end.
"""
from __future__ import annotations

import math
import time

import torch

from ..accuracy import compare, gate_dtype
from ..cases import run_kernel
from ..configs import LaunchConfig
from ..plan import forget_plans
from ..reference import reference_batched
from .buckets import Bucket
from .gpu_lock import held

_inputs: dict = {}  # bucket -> (timing sets, accuracy case, reference); one bucket kept at a time


def _device(interpret: bool) -> tuple[str, torch.dtype]:
    # The interpreter gets bf16 arithmetic wrong (triton#11584): fp32 queries there.
    return ("cpu", torch.float32) if interpret else ("cuda", torch.bfloat16)


def bucket_inputs(bucket: Bucket, interpret: bool, accuracy_seed: int = 1000):
    key = (bucket, interpret, accuracy_seed)
    if key not in _inputs:
        _inputs.clear()
        if not interpret:
            torch.cuda.empty_cache()
        device, q_dtype = _device(interpret)
        first = bucket.build_case(seed=0, device=device, q_dtype=q_dtype)
        if interpret:
            sets = [first]
        else:
            from ..timing import input_sets
            from ..workload import min_bytes

            n_sets = input_sets(min_bytes(first))
            sets = [first] + [bucket.build_case(seed=s, device=device, q_dtype=q_dtype) for s in range(1, n_sets)]
        accuracy = bucket.build_case(seed=accuracy_seed, device=device, q_dtype=q_dtype)
        ref = reference_batched(accuracy.kernel, accuracy.args, dtype=torch.float64 if interpret else torch.float32)
        _inputs[key] = (sets, accuracy, ref)
        if not interpret:
            _give_back_temporaries()  # the builds' and the reference's
    return _inputs[key]


def _classify(exc: BaseException) -> tuple[str, bool]:
    """(failure kind, whether the process must be restarted)."""
    name = type(exc).__name__
    text = str(exc)
    if name == "OutOfResources" or "out of resource" in text.lower():
        return "out_of_resources", False
    if name in ("CompilationError", "CompileTimeAssertionFailure") or "PassManager::run failed" in text:
        return "compile_error", False
    if name == "OutOfMemoryError" or "CUDA out of memory" in text:
        return "out_of_memory", True  # the GPU's state, not the config's verdict: restart, retry later
    if "illegal memory access" in text or "CUDA error" in text or "device-side assert" in text:
        return "crash", True  # the CUDA context is unusable after this
    return "error", False


def _time_interpreted(call) -> dict:
    start = time.perf_counter()
    call()
    elapsed = (time.perf_counter() - start) * 1e6
    return dict(time_us=elapsed, p10_us=elapsed, p90_us=elapsed, calls=1, replays=1)


def _time_on_gpu(sets, config) -> dict:
    from ..timing import graph_time

    # Estimate one call, then size the graph: ~20 calls for short kernels (launch latency amortized),
    # fewer for long ones; enough replays for a stable median without wasting the lease.
    run_kernel(sets[0], config=config)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run_kernel(sets[1 % len(sets)], config=config)
    end.record()
    end.synchronize()
    estimate_us = max(start.elapsed_time(end) * 1e3, 1.0)
    calls = min(20, max(len(sets), math.ceil(4000 / estimate_us)))  # every set at least once (>= 2)
    replays = max(5, min(25, math.ceil(60_000 / (calls * estimate_us))))
    timing = graph_time([lambda c=sets[i % len(sets)]: run_kernel(c, config=config) for i in range(calls)],
                        replays=replays, warmup_replays=2)
    return dict(time_us=timing.median_us, p10_us=timing.p10_us, p90_us=timing.p90_us, calls=calls, replays=replays)


class _Phases(dict):
    """Wall seconds of a trial's phases, for the tuner's time account (PHASES)."""

    def __init__(self):
        super().__init__()
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self[name] = self.get(name, 0.0) + now - self._last
        self._last = now


# A trial's phases, in order: building the bucket's inputs and reference (its first trial only), the
# config's first launch in this process (loading the compiled kernel) and the accuracy check, timing
# (on a GPU split into the graph replays and the rest).
PHASES = ("inputs", "check", "timing")


def run_trial(request: dict) -> dict:
    """One trial: {"bucket": Bucket fields, "config": LaunchConfig fields, "interpret": bool,
    "check": bool} -> {"ok": True, "time_us": ..., "phases": {...}} or {"ok": False, "kind": ...,
    "message": ..., "phases": {...}}."""
    with held(request.get("gpu_lock")):  # the GPU is this trial's alone (gpu_lock.py)
        return _run_trial(request)


def _run_trial(request: dict) -> dict:
    bucket = Bucket(**request["bucket"])
    config = LaunchConfig.from_dict(request["config"])
    interpret = request.get("interpret", False)
    phases = _Phases()
    try:
        sets, accuracy, ref = bucket_inputs(bucket, interpret)
        if not interpret:
            torch.cuda.synchronize()
        phases.lap("inputs")
        result = {}
        if request.get("check", True):
            accuracy.poison()
            out = run_kernel(accuracy, arch=bucket.arch if interpret else None, config=config)
            if not interpret:
                torch.cuda.synchronize()
            verdict = compare(out, ref, gate_dtype(accuracy.args["q"].dtype, config))
            phases.lap("check")
            result.update(rel_l2=verdict.rel_l2, max_abs=verdict.max_abs)
            if not verdict.ok:
                return dict(ok=False, kind="wrong_result", message=str(verdict), phases=dict(phases), **result)
        if interpret:
            result.update(_time_interpreted(lambda: run_kernel(sets[0], arch=bucket.arch, config=config)))
        else:
            result.update(_time_on_gpu(sets, config))
        phases.lap("timing")
        if not interpret:
            # The GPU time of the graph replays (2 warm-up replays, _time_on_gpu), out of timing's wall
            # time: the rest of timing is the eager runs, the capture and the host.
            replays = min(phases["timing"], result["time_us"] * 1e-6 * result["calls"] * (result["replays"] + 2))
            phases["timing"] -= replays
            phases["replays"] = replays
        return dict(ok=True, phases=dict(phases), **result)
    except Exception as exc:  # noqa: BLE001 - every failure is a recorded trial outcome
        kind, fatal = _classify(exc)
        phases.lap(next((p for p in PHASES if p not in phases), "timing"))  # where it stopped
        return dict(ok=False, kind=kind, message=f"{type(exc).__name__}: {exc}"[:2000], fatal=fatal,
                    phases=dict(phases))


_first_sets: dict = {}  # bucket -> its first timing input set, for precompiling


def static_problems(bucket: Bucket, config: LaunchConfig) -> list[str]:
    """The ahead-of-time resource check of codegen.static for this launch (empty: it fits)."""
    from ..static import check_launch

    reports = check_launch(bucket.arch, bucket.kernel, bucket.scale_mode, bucket.kv_dtype, bucket.num_q_heads,
                           bucket.num_kv_heads, config, head_dim=bucket.head_dim, topk=bucket.topk)
    return [f"{r.variant}: {p}" for r in reports for p in r.problems]


def prepare_timed(request: dict) -> tuple[list[str], dict]:
    """prepare(request), and the seconds its phases took (for the preparer's time account)."""
    phases = _Phases()
    problems = prepare(request, phases)
    return problems, dict(phases)


def prepare(request: dict, phases: _Phases | None = None) -> list[str]:
    """Runs in a preparer process: static check, then (GPU) the JIT compile for the bucket's first
    input set, without running it, filling Triton's disk cache so the trial worker only loads the binary. Returns
    the static problems (a checker that raises is one: the candidate fails, kind "static");
    compile and run failures are left for the isolated trial to record.
    On a GPU of the bucket's arch, the static figures are read off the kernels the JIT compiled for
    that compile (codegen.static.jit): one compile a candidate instead of two. `phases`: laps "static",
    "inputs", "compile" and "figures" are added to it."""
    phases = _Phases() if phases is None else phases
    bucket = Bucket(**request["bucket"])
    config = LaunchConfig.from_dict(request["config"])
    gpu = request.get("precompile") and not request.get("interpret")
    jit_figures = gpu and _on_arch(bucket.arch)  # the gate reads the kernels compiled here
    if request.get("static") and not jit_figures:
        try:
            problems = static_problems(bucket, config)
        except Exception as exc:  # noqa: BLE001 - recorded as the candidate's failure, never as a pass
            return _check_raised(exc)
        finally:
            phases.lap("static")
        if problems:
            return problems
    if not gpu:
        return []
    from ..static.jit import compiled_not_launched, launch_problems

    kernels = []
    try:
        if bucket not in _first_sets:
            with held(request.get("gpu_lock")):  # building inputs runs kernels: not during a trial
                _first_sets.clear()
                _first_sets[bucket] = bucket.build_case(seed=0, device="cuda", q_dtype=torch.bfloat16)
                torch.cuda.synchronize()
                _give_back_temporaries()
        phases.lap("inputs")
        with compiled_not_launched() as kernels:  # compiled and loaded, not run
            run_kernel(_first_sets[bucket], config=config)
    except Exception:  # noqa: BLE001 - the trial worker reproduces and records it
        pass
    finally:
        phases.lap("compile")
        # A dozen preparers each holding a large bucket's inputs left the trial worker without
        # memory (H200, decode 64x4@256: 13 trials failed with CUDA OOM). Keep inputs up to a 48th
        # of the GPU's memory (12 preparers: a quarter) for the next candidate; give larger ones back,
        # with the plans the compile made (their buffers may sit in the inputs' allocator segments).
        # (The ~14 GiB a preparer of decode 64x4@512 was the build's fp32 draw, given back after the build:
        # _give_back_temporaries.)
        if torch.cuda.memory_allocated() > _keep_bytes():
            _first_sets.clear()
            forget_plans()
            torch.cuda.empty_cache()
    if not request.get("static") or not jit_figures:  # off its arch: checked ahead of time above
        return []
    try:
        if kernels:
            return launch_problems(kernels, bucket.arch) + _slow_compile(phases.get("compile", 0.0), len(kernels))
        return static_problems(bucket, config)  # nothing compiled here: the gate compiles ahead of time
    except Exception as exc:  # noqa: BLE001 - recorded as the candidate's failure, never as a pass
        return _check_raised(exc)
    finally:
        phases.lap("figures")


def _slow_compile(seconds: float, kernels: int) -> list[str]:
    """The JIT's compile of a candidate's kernels, judged like the ahead-of-time one
    (codegen.static.COMPILE_SECONDS_LIMIT a kernel): a config that slow costs every fresh machine
    (tests, users' first calls) more than its speed gives back. A Triton cache hit takes no time."""
    from ..static import COMPILE_SECONDS_LIMIT

    limit = COMPILE_SECONDS_LIMIT * max(kernels, 1)
    if seconds <= limit:
        return []
    return [f"compile time {seconds:.1f} s for {kernels} kernel(s) > limit {limit:g} s (Triton + ptxas, JIT)"]


def _check_raised(exc: Exception) -> list[str]:
    """A static check that raised fails its candidate. Fail closed: an unchecked candidate could be
    one the check exists to keep off the GPU."""
    return [f"the static check raised {type(exc).__name__}: {exc} (fix it, or tune with --no-static-check)"]


def _on_arch(arch: str) -> bool:
    """Whether this process's GPU is of `arch` (its JIT then compiles what the static check needs)."""
    from ..validate import detect_device_arch

    try:
        return torch.cuda.is_available() and detect_device_arch(torch.device("cuda")) == arch
    except Exception:  # noqa: BLE001 - no GPU, or one of no supported arch
        return False


def _give_back_temporaries() -> None:
    """Returns the memory a bucket's build (and in the trial worker its reference) freed to the GPU. The random KV cache is drawn in fp32 and
    then cast: 4x its fp8 bytes, 10.7 GiB at decode 64x4@512 (2.7 GiB of cache), which the caching
    allocator keeps reserved once freed. In every preparer that was ~14 GiB (inputs 2.7 + the fp32
    draw 10.7: the "unknown" 14 GiB of docs/tuning.md), so 12 preparers filled an H200 at 512
    requests and an H100 at 256 (6.7 GiB each)."""
    torch.cuda.empty_cache()


def _keep_bytes() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 48
