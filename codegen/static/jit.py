"""The static gate's figures for kernels the JIT has just compiled on this GPU, instead of a second,
ahead-of-time compile of the same kernel.

On a GPU host the tuner compiles each candidate twice otherwise: `check_launch` (typical integer
arguments, so the binary differs from the real launch's and Triton's cache cannot share it) and the
JIT's own compile for the bucket's inputs. In the H200 sample of 2026-12-01 those compiles were a
third of the run (121 of 363 s). Here the JIT's kernels are read directly: registers, local memory
(spills) and shared memory from the cubin (sm90, as `_sm90_figures` without a ptxas log) or the
amdgcn text (gfx942), judged by the same `problems_of`.
"""
from __future__ import annotations

import contextlib

from .compile import _gfx942_figures, _sm90_figures


@contextlib.contextmanager
def launched_kernels():
    """Collects the CompiledKernels launched inside the block (every JIT launch asks its kernel
    for launch metadata first, triton 3.6 .. 3.9); yields the list, in launch order, one entry per
    kernel."""
    from triton.compiler.compiler import CompiledKernel

    seen: dict[int, object] = {}
    original = CompiledKernel.launch_metadata

    def record(self, *args, **kwargs):
        seen.setdefault(id(self), self)
        return original(self, *args, **kwargs)

    kernels: list = []
    CompiledKernel.launch_metadata = record
    try:
        yield kernels
    finally:
        CompiledKernel.launch_metadata = original
        kernels.extend(seen.values())


_figures_by_hash: dict[tuple, dict] = {}  # a preparer launches the same kernels for many candidates


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
    """Every limit the launched `kernels` break, each prefixed with its kernel's name."""
    from .report import problems_of

    return [f"{kernel.name}: {problem}" for kernel in kernels
            for problem in problems_of(arch, kernel_figures(kernel, arch))]
