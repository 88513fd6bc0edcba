"""The static gate's figures for kernels the JIT has just compiled on this GPU, instead of a second,
ahead-of-time compile of the same kernel; and the compile itself without a launch.

On a GPU host the tuner compiles each candidate twice otherwise: `check_launch` (typical integer
arguments, so the binary differs from the real launch's and Triton's cache cannot share it) and the
JIT's own compile for the bucket's inputs. In the H200 sample of 2026-12-01 those compiles were a
third of the run (121 of 363 s). Here the JIT's kernels are read directly: registers, local memory
(spills) and shared memory from the cubin (sm90, as `_sm90_figures` without a ptxas log) or the
amdgcn text (gfx942), judged by the same `problems_of`. The tuner's preparers compile without
launching (`compiled_not_launched`), so that they never run on the GPU while a trial is timed there.
"""
from __future__ import annotations

import contextlib

from .compile import _gfx942_figures, _sm90_figures


@contextlib.contextmanager
def compiled_not_launched():
    """Inside the block, a JIT launch `kernel[grid](...)` compiles (or loads from Triton's cache)
    and loads its kernel but does not run it: no GPU work, so a trial timing on the same GPU is left
    alone. Yields the list of CompiledKernels, filled in launch order (triton 3.6 .. 3.9:
    KernelInterface.__getitem__ is the launch proxy, run(..., warmup=True) the compile)."""
    from triton.runtime.jit import KernelInterface

    kernels: list = []
    original = KernelInterface.__getitem__

    def compile_only(self, grid):
        def proxy(*args, **kwargs):
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            init = getattr(kernel, "_init_handles", None)
            if init is not None:
                init()  # loads the binary and builds its launcher, as a first launch would, without running it
            kernels.append(kernel)
            return kernel
        return proxy

    KernelInterface.__getitem__ = compile_only
    try:
        yield kernels
    finally:
        KernelInterface.__getitem__ = original


_figures_by_hash: dict[tuple, dict] = {}  # a preparer compiles the same kernels for many candidates


def kernel_figures(kernel, arch: str) -> dict:
    """The static gate's figures (codegen.static.compile) of one compiled kernel (read once per
    process and binary)."""
    key = (arch, getattr(kernel, "hash", None) or id(kernel))
    if key not in _figures_by_hash:
        _figures_by_hash[key] = _read_figures(kernel, arch)
    return _figures_by_hash[key]


def _read_figures(kernel, arch: str) -> dict:
    figures = _sm90_figures(kernel, ptxas_log="") if arch == "sm90" else _gfx942_figures(kernel)
    if arch == "sm90" and figures.get("registers") is None:  # no cuobjdump: what the driver reports
        figures.update(registers=getattr(kernel, "n_regs", None), spill=4 * getattr(kernel, "n_spills", 0),
                       notes=figures["notes"] + ["figures from the loaded function's attributes"])
    return figures


def launch_problems(kernels, arch: str) -> list[str]:
    """Every limit the compiled `kernels` break, each prefixed with its kernel's name."""
    from .report import problems_of

    return [f"{kernel.name}: {problem}" for kernel in kernels
            for problem in problems_of(arch, kernel_figures(kernel, arch))]
