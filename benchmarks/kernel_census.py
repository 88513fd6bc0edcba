"""pytest plugin: runs tests/gpu on a CPU without a GPU and without launching or compiling anything,
and counts the distinct (kernel, specialization) pairs the suite would compile on a cold cache.

Usage (the static gate's Triton, no TRITON_INTERPRET):
  PYTHONPATH=benchmarks:. .venv-static/bin/python -m pytest -q -p kernel_census tests/gpu
prints "CENSUS: N distinct kernels ..." at the end (CENSUS_OUT=PATH also writes it to a file).

How: torch.cuda is faked (available, no-op synchronize and graphs), codegen.cases builds its
inputs on the CPU, the references and compares are stubbed, and a launch `kernel[grid](...)`
records a key instead of running: the kernel's name, each argument specialized as Triton's JIT does
(a tensor's dtype and 16-byte alignment, an int's ==1 and %16, a descriptor's block shape) and the
constexpr/option keywords. Tests that assert on the (never written) outputs fail, as expected: the
padded-row checks of test_decode_gpu, the unaligned cache (a CUDA allocation) and the decision
kernel's results. Everything before those asserts (inputs, API validation, configs) runs for real.
"""
import collections
import contextlib
import os
import types

import torch

KEYS: collections.Counter = collections.Counter()
TESTS_OF = collections.defaultdict(set)
_CURRENT = [None]


def _spec(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return ("const", value)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0)
    if isinstance(value, float):
        return ("float",)
    shape = getattr(value, "block_shape", None)
    if shape is not None:
        return ("descriptor", tuple(shape), str(getattr(getattr(value, "base", None), "dtype", None)))
    return (type(value).__name__,)


def _record(self, grid):
    def proxy(*args, **kwargs):
        fn = self
        while not hasattr(fn, "arg_names"):
            fn = fn.fn
        key = (fn.__name__, *((name, _spec(v)) for name, v in zip(fn.arg_names, args)),
               *((name, _spec(v) if isinstance(v, torch.Tensor) else repr(v)) for name, v in sorted(kwargs.items())))
        KEYS[key] += 1
        TESTS_OF[key].add(_CURRENT[0])
    return proxy


def pytest_configure(config):
    from triton.runtime.jit import KernelInterface

    import codegen.accuracy as accuracy
    import codegen.api as api
    import codegen.cases as cases
    import codegen.validate as validate

    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.CUDAGraph = lambda: types.SimpleNamespace(replay=lambda: None)
    torch.cuda.graph = lambda graph, **k: contextlib.nullcontext()
    torch.cuda.get_device_name = lambda *a: "NVIDIA H200"
    validate.detect_device_arch = lambda device: "sm90"
    validate.resolve_arch = lambda arch, device: arch or "sm90"
    api._use_pdl = lambda q: True  # as on an H200
    for name in ("prefill_case", "decode_case", "serving_case"):
        build = getattr(cases, name)
        setattr(cases, name, lambda *a, _build=build, **k: _build(*a, **dict(k, device="cpu")))
    cases.run_reference = lambda case, *a, **k: torch.zeros(case.args["q"].shape, dtype=torch.float64)
    accuracy.compare = lambda *a, **k: types.SimpleNamespace(ok=True)
    KernelInterface.__getitem__ = _record


def pytest_runtest_setup(item):
    _CURRENT[0] = item.nodeid


def pytest_sessionfinish(session):
    names = dict(collections.Counter(key[0] for key in KEYS))
    shared = sum(1 for key in KEYS if len(TESTS_OF[key]) > 1)
    line = (f"CENSUS: {len(KEYS)} distinct kernels, {sum(KEYS.values())} launches, {shared} used by more "
            f"than one test; {names}")
    print("\n" + line)
    if os.environ.get("CENSUS_OUT"):
        with open(os.environ["CENSUS_OUT"], "w") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":  # a pytest plugin: run as a script, it says how to use it
    import sys

    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    sys.exit("kernel_census.py: a pytest plugin, not a script: PYTHONPATH=benchmarks:. .venv-static/bin/python "
             "-m pytest -q -p kernel_census tests/gpu")
