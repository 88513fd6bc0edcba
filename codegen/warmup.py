"""Warm-up: compile, before the first request, every kernel the tuned table can pick for a model.

Triton compiles a kernel on its first launch for a new specialization (1-3 s each for these
kernels on the H200's host) and keeps the binary in its cache (~/.triton/cache or
TRITON_CACHE_DIR). A server that meets a new shape mid-traffic stalls for that long. `warmup`
compiles ahead: for each kernel family, scale mode and head layout it asks the loader which
config every token count gets (so it covers exactly what the table, or the arch default, will
pick), and which specializations those calls make:

  * Triton specializes integer arguments on being 1 or a multiple of 16. Of the arguments that
    vary with the batch, decode's `num_reqs` (and `decode_query_len`) do: each decode config is
    compiled for the request-count classes its token range holds. Prefill's integer arguments
    are strides and topk, fixed by the layout; its grid is not part of the binary. The `auto`
    decision kernel does not specialize on its counts (codegen.selection_kernel); the Gluon tile
    decides in its plan launch (a specialization of its own: warmed up by an `auto` prefill job).
  * Strides: the block table's row stride is `cdiv(max_model_len, 128)` (vLLM's persistent block
    table); the other tensors' strides fall in the same classes for any of vLLM's layouts.

Compiles run in worker processes (each its own CUDA context, writing Triton's on-disk cache);
the calling process then loads binaries instead of compiling them. Inside a worker a call
compiles without launching (codegen.static.jit.compiled_not_launched).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
import time

from .shapes import DEFAULT_LAYOUTS, DEFAULT_MODES, HEAD_LAYOUTS
from .variants import PAGE_SIZE, TUNABLE_KERNELS

DECODE_MAX_TOKENS = 1024  # decode batches up to this many query tokens (requests x query length)
PREFILL_TOKEN_COUNTS = tuple(2 ** i for i in range(17))  # chunks of 1..65536 tokens


@dataclasses.dataclass(frozen=True)
class Job:
    """One API call that compiles what a class of real calls will launch."""

    kernel: str  # "prefill", "decode" or "decision" (prefill's auto decision kernel)
    scale_mode: str
    kv_dtype: str
    layout: str | tuple  # a name of shapes.HEAD_LAYOUTS or (q heads, KV heads)
    config: tuple  # LaunchConfig fields as sorted items (hashable); () for the decision kernel
    selection: str = "tiled"  # prefill: "tiled" or "per_token"
    num_reqs: int = 1  # decode: a request count of the class the job stands for
    query_len: int = 1  # decode: tokens per request
    block_t: int = 0  # decision kernel: the tile it decides for

    def describe(self) -> str:
        what = {"decode": f"{self.num_reqs} req x {self.query_len}", "prefill": self.selection,
                "decision": f"block_t {self.block_t}"}[self.kernel]
        return f"{self.kernel} {self.scale_mode}:{self.kv_dtype} {self.layout} {what} {dict(self.config)}"


@dataclasses.dataclass
class WarmupReport:
    jobs: int
    failed: list  # (job description, error)
    seconds: float
    workers: int

    def __str__(self) -> str:
        ok = self.jobs - len(self.failed)
        return f"warm-up: {ok}/{self.jobs} compile jobs in {self.seconds:.1f} s on {self.workers} worker(s)"


def head_layout(layout, what: str = "layouts") -> tuple[int, int]:
    """(q heads, KV heads) of a layout given by name (tp1, tp4, ...) or as the pair itself."""
    if isinstance(layout, str):
        if layout not in HEAD_LAYOUTS:
            raise ValueError(f"{what}: expected names from {sorted(HEAD_LAYOUTS)} or (q heads, KV heads) pairs, "
                             f"got {layout!r}")
        return HEAD_LAYOUTS[layout]
    num_q_heads, num_kv_heads = layout
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"{what}: KV heads must divide q heads, got {layout!r}")
    return int(num_q_heads), int(num_kv_heads)


def _specialization_class(n: int) -> int:
    """A representative of n's integer specialization class in Triton: 1, a multiple of 16, other."""
    return 1 if n == 1 else 16 if n % 16 == 0 else 3


def plan_jobs(arch: str, device_name: str, *, layouts=DEFAULT_LAYOUTS, modes=DEFAULT_MODES,
              kernels=TUNABLE_KERNELS, query_lens=(1,), topk: int = 16) -> list[Job]:
    """The distinct compile jobs that cover every config the loader picks for these calls."""
    from .loader import get_config

    jobs: dict[Job, None] = {}
    for layout in layouts:
        num_q_heads, num_kv_heads = head_layout(layout)
        for scale_mode, kv_dtype in modes:
            common = dict(scale_mode=scale_mode, kv_dtype=kv_dtype, layout=layout)
            lookup = lambda kernel, n, **kw: get_config(kernel, arch, device_name, scale_mode, kv_dtype,  # noqa: E731
                                                        num_q_heads, num_kv_heads, n, topk, **kw).config
            if "decode" in kernels:
                for query_len in query_lens:
                    for num_reqs in range(1, DECODE_MAX_TOKENS // query_len + 1):
                        config = lookup("decode", num_reqs * query_len)
                        jobs[Job("decode", config=_items(config), num_reqs=_specialization_class(num_reqs),
                                 query_len=query_len, **common)] = None
            if "prefill" in kernels:
                for tokens in PREFILL_TOKEN_COUNTS:
                    tiled = lookup("prefill", tokens)
                    per_token = lookup("prefill", tokens, per_token=True)
                    jobs[Job("prefill", config=_items(tiled), selection="tiled", **common)] = None
                    jobs[Job("prefill", config=_items(per_token), selection="per_token", **common)] = None
                    if tiled.block_t > 1 and tiled.warp_specialize:  # 'auto' is its plan launch's DECIDE
                        jobs[Job("prefill", config=_items(tiled), selection="auto", **common)] = None
                    elif tiled.block_t > 1:
                        jobs[Job("decision", config=(), block_t=tiled.block_t, **common)] = None
    return list(jobs)


def _items(config) -> tuple:
    return tuple(sorted(config.to_dict().items()))


def run_job(job: Job, *, arch: str, device: str, max_model_len: int, q_dtype_name: str = "bf16",
            head_dim: int = 128, topk: int = 16) -> None:
    """Compiles (without launching) the kernels of one job on the current process's GPU."""
    import torch

    from . import selection_kernel
    from .api import sparse_attn_decode, sparse_attn_prefill
    from .configs import LaunchConfig
    from .shapes import DTYPES, torch_dtype
    from .static.jit import compiled_not_launched

    num_q_heads, num_kv_heads = head_layout(job.layout)
    q_dtype, kv_dtype = DTYPES[q_dtype_name], torch_dtype(arch, job.kv_dtype)
    pages, max_blocks = 4, -(-max_model_len // PAGE_SIZE)
    num_reqs = job.num_reqs if job.kernel == "decode" else 1
    total_q = num_reqs * job.query_len if job.kernel == "decode" else 8
    dev = torch.device(device)
    # Values do not matter (nothing runs); shapes, dtypes, strides and alignment classes do.
    q = torch.zeros(total_q, num_q_heads, head_dim, dtype=q_dtype, device=dev)
    kv_cache = torch.zeros(pages, num_kv_heads, PAGE_SIZE, 2 * head_dim, dtype=kv_dtype, device=dev)
    topk_idx = torch.zeros(total_q, num_kv_heads, topk, dtype=torch.int32, device=dev).transpose(0, 1)
    block_table = torch.zeros(num_reqs, max_blocks, dtype=torch.int32, device=dev)
    seq_lens = torch.ones(num_reqs, dtype=torch.int32, device=dev)
    scales = {"none": (None, None),
              "scalar": (torch.ones(1, device=dev), torch.ones(1, device=dev)),
              "per_token_head": (torch.ones(num_kv_heads, pages * PAGE_SIZE, device=dev),) * 2}[job.scale_mode]
    common = dict(arch=arch)
    with compiled_not_launched():
        if job.kernel == "decision":
            cu = torch.tensor([0, total_q], dtype=torch.int32, device=dev)
            selection_kernel.decide_and_split(topk_idx, job.block_t, 1.0, cu, torch.zeros(1, dtype=torch.int32,
                                              device=dev), 256, counters=torch.zeros(3, dtype=torch.int32, device=dev))
        elif job.kernel == "decode":
            sparse_attn_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, head_dim ** -0.5,
                               torch.empty_like(q), job.query_len, *scales, config=LaunchConfig(**dict(job.config)),
                               **common)
        else:
            cu = torch.tensor([0, total_q], dtype=torch.int32, device=dev)
            sparse_attn_prefill(q, kv_cache, topk_idx, block_table, cu, seq_lens * total_q,
                                torch.zeros(1, dtype=torch.int32, device=dev), total_q, num_kv_heads,
                                head_dim ** -0.5, torch.empty_like(q), *scales,
                                config=LaunchConfig(**dict(job.config)), selection=job.selection, **common)


def _worker(jobs, arch, device, max_model_len, q_dtype_name):
    """A worker process: runs its jobs, returns (description, seconds, error or None) for each."""
    import torch

    from . import plan as call_plans

    torch.cuda.set_device(torch.device(device))
    kept = call_plans.PLANS.snapshot()  # the jobs' own plans (toy shapes) are not kept
    results = []
    for job in jobs:
        start = time.perf_counter()
        try:
            run_job(job, arch=arch, device=device, max_model_len=max_model_len, q_dtype_name=q_dtype_name)
            error = None
        except Exception as exc:  # one failing compile must not stop the others; reported at the end
            error = f"{type(exc).__name__}: {exc}"
        results.append((job.describe(), time.perf_counter() - start, error))
    call_plans.PLANS.restore(kept)
    return results


class NoGPU(RuntimeError):
    """No GPU to compile for (the command's exit code 1)."""


def check_arguments(*, layouts, modes, kernels, query_lens, max_model_len: int, workers: int | None,
                    option=lambda name: name) -> None:
    """warmup's arguments, checked without a GPU (ValueError naming the argument as `option` spells
    it: the keyword, or the command line's --flag)."""
    from .shapes import KV_DTYPES
    from .variants import SCALE_MODES

    for name, values in (("layouts", layouts), ("modes", modes), ("kernels", kernels), ("query_lens", query_lens)):
        if not values:
            raise ValueError(f"{option(name)}: expected at least one")
    for layout in layouts:
        head_layout(layout, option("layouts"))
    for pair in modes:
        if len(pair) != 2 or pair[0] not in SCALE_MODES or pair[1] not in KV_DTYPES:
            raise ValueError(f"{option('modes')}: expected scale_mode:kv_dtype pairs of {SCALE_MODES} and "
                             f"{KV_DTYPES}, got {':'.join(pair)!r}")
        if pair[0] != "none" and pair[1] != "fp8":  # as tune.py's --modes: scales come with an fp8 cache
            raise ValueError(f"{option('modes')}: scale mode {pair[0]!r} needs an fp8 cache, got {':'.join(pair)!r}")
    bad = sorted(set(kernels) - set(TUNABLE_KERNELS))
    if bad:
        raise ValueError(f"{option('kernels')}: expected names from {TUNABLE_KERNELS}, got {bad}")
    if any(not isinstance(n, int) or n < 1 for n in query_lens):
        raise ValueError(f"{option('query_lens')}: expected positive token counts, got {list(query_lens)}")
    if max_model_len < 1:
        raise ValueError(f"{option('max_model_len')}: expected a positive token count, got {max_model_len}")
    if workers is not None and workers < 1:
        raise ValueError(f"{option('workers')}: expected >= 1, got {workers}")


def warmup(*, layouts=DEFAULT_LAYOUTS, modes=DEFAULT_MODES, kernels=TUNABLE_KERNELS, query_lens=(1,),
           max_model_len: int = 131072, workers: int | None = None, device=None, q_dtype: str = "bf16",
           progress: bool = True, out=sys.stderr) -> WarmupReport:
    """Compiles every kernel the tuned table (or the arch default) can pick for these calls into
    Triton's cache. workers: compile processes (default: the CPU count, at most 16; 1 compiles in
    this process, which also keeps the call plans). Returns what it did; failures are listed, not
    raised (the call would compile at its first request instead)."""
    import torch

    from .api import device_name as name_of
    from .validate import detect_device_arch

    check_arguments(layouts=layouts, modes=modes, kernels=kernels, query_lens=query_lens,
                    max_model_len=max_model_len, workers=workers)
    if not torch.cuda.is_available():  # after the arguments: a bad one is said even without a GPU
        raise NoGPU("no GPU is visible (CUDA/ROCm): the warm-up compiles for one")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    arch = detect_device_arch(dev)
    jobs = plan_jobs(arch, name_of(dev), layouts=layouts, modes=modes, kernels=kernels, query_lens=query_lens)
    workers = min(16, os.cpu_count() or 1) if workers is None else workers
    workers = min(workers, len(jobs)) or 1
    start = time.perf_counter()
    failed = []
    show = _progress(len(jobs), progress, out)
    if workers == 1:
        for job in jobs:
            for description, _, error in _worker([job], arch, str(dev), max_model_len, q_dtype):
                if error:
                    failed.append((description, error))
            show(1)
    else:
        # Interleaved shares: neighbouring jobs (one table's buckets) spread over the workers.
        shares = [jobs[i::workers] for i in range(workers)]
        context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = []
            for share in shares:
                for chunk in (share[i:i + 4] for i in range(0, len(share), 4)):
                    futures.append(pool.submit(_worker, chunk, arch, str(dev), max_model_len, q_dtype))
            for future in concurrent.futures.as_completed(futures):
                results = future.result()
                failed.extend((description, error) for description, _, error in results if error)
                show(len(results))
    show(0, done=True)
    return WarmupReport(len(jobs), failed, time.perf_counter() - start, workers)


def _progress(total: int, enabled: bool, out):
    """A progress bar (tqdm when installed, else a line per tenth) as a function of jobs done."""
    if not enabled:
        return lambda n, done=False: None
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="msa-tune warm-up", unit="job", file=out)

        def show(n, done=False):
            bar.update(n)
            if done:
                bar.close()
        return show
    except ImportError:
        state = {"done": 0, "said": 0}

        def show(n, done=False):
            state["done"] += n
            tenth = state["done"] * 10 // max(total, 1)
            if tenth > state["said"] or done:
                state["said"] = tenth
                print(f"msa-tune warm-up: {state['done']}/{total} jobs", file=out, flush=True)
        return show
