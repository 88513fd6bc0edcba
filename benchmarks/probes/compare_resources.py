"""Do the CPU (ahead-of-time) resource figures match what the GPU loads? Run on the H200 (sm90).

For a few configs, launches the generated kernels through codegen.api on real inputs (the normal
JIT path), reads the loaded kernels' figures (``n_regs``, ``n_spills``, ``metadata.shared``) from
the JIT cache, compiles the same launches with codegen.static.compile_report, and compares:
- registers: GPU n_regs vs CPU registers (cuobjdump REG);
- spills: GPU n_spills (local memory size / 4) vs CPU (stack + local bytes) / 4, plus the ptxas
  spill-store bytes the CPU report gates on;
- shared memory: GPU metadata.shared vs CPU shared_bytes;
- specialization: the JIT's signature/constants/attrs vs what codegen.static assumed.

    PYTHONPATH=. python3 benchmarks/probes/compare_resources.py --out resources.json

Prints a table and writes JSON; a field it cannot read is shown as "?" (never a crash). Exit 1
when a figure that could be read on both sides differs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback

import torch
import triton

from codegen import cases, static
from codegen.modules import load_module
from codegen.configs import LaunchConfig


@dataclasses.dataclass(frozen=True)
class Probe:
    kernel: str  # "prefill" | "decode"
    scale_mode: str
    kv_dtype: str
    num_q_heads: int
    num_kv_heads: int
    config: LaunchConfig


PROBES = [
    Probe("prefill", "scalar", "fp8", 64, 4, LaunchConfig(block_t=1)),
    Probe("prefill", "scalar", "fp8", 64, 4, LaunchConfig(block_t=4)),
    Probe("prefill", "none", "bf16", 8, 1, LaunchConfig()),
    # spills under triton 3.6 (255 registers, ~1.7 KB of spill stores): checks the spill equivalence
    Probe("prefill", "scalar", "fp8", 64, 4, LaunchConfig(block_t=8, block_n=128)),
    Probe("decode", "scalar", "fp8", 64, 4, LaunchConfig(num_splits=1)),
    Probe("decode", "scalar", "fp8", 64, 4, LaunchConfig(num_splits=4)),  # split + merge
    Probe("decode", "per_token_head", "fp8", 64, 4, LaunchConfig(num_splits=1)),
]

# Shapes chosen so the JIT sees what codegen.static assumes: 3-4 requests (neither 1 nor a multiple
# of 16) and 16 logical blocks in the longest request (a block-table row stride divisible by 16).
PREFILL_SHAPE = dict(q_lens=[40, 7, 130], prefix_lens=[1900, 0, 900])
DECODE_SEQ_LENS = [2000, 130, 1500, 1900]


def _build_case(probe: Probe, arch: str):
    common = dict(arch=arch, num_q_heads=probe.num_q_heads, num_kv_heads=probe.num_kv_heads,
                  kv_dtype=probe.kv_dtype, scale_mode=probe.scale_mode, q_dtype=torch.bfloat16, device="cuda")
    if probe.kernel == "prefill":
        return cases.prefill_case(**PREFILL_SHAPE, **common)
    return cases.decode_case(seq_lens=DECODE_SEQ_LENS, **common)


def _kernel_caches(jit_fn) -> list[dict]:
    """The JIT's per-device {key: CompiledKernel} dicts (triton 3.x keeps them in device_caches)."""
    found = []
    for entry in list(getattr(jit_fn, "device_caches", {}).values()):
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            found.append(cache)
    for cache in list(getattr(jit_fn, "cache", {}).values()):  # older layout
        if isinstance(cache, dict):
            found.append(cache)
    return found


def _compiled(jit_fn) -> dict[int, object]:
    return {id(kernel): kernel for cache in _kernel_caches(jit_fn) for kernel in cache.values()}


def _read(obj, *path):
    """obj.a.b... or None when any step is missing."""
    try:
        for name in path:
            obj = getattr(obj, name)
        return obj
    except Exception:  # a missing or failing attribute is reported as unknown
        return None


def _gpu_figures(kernel) -> dict:
    with_handles = _read(kernel, "_init_handles")
    if callable(with_handles):
        try:
            with_handles()
        except Exception as exc:
            print(f"  (could not load kernel handles: {exc})")
    return {"n_regs": _read(kernel, "n_regs"), "n_spills": _read(kernel, "n_spills"),
            "shared": _read(kernel, "metadata", "shared"), "name": _read(kernel, "name"),
            "num_warps": _read(kernel, "metadata", "num_warps"), "num_stages": _read(kernel, "metadata", "num_stages")}


def _specialization_diff(kernel, launch: static.StaticLaunch) -> list[str]:
    """Where the JIT's specialization differs from codegen.static's assumption (empty: identical)."""
    src = _read(kernel, "src")
    if src is None or not hasattr(src, "signature"):
        return ["JIT source not available: specialization not compared"]
    inputs = static.compile_inputs(launch)
    arg_names = load_module(launch.arch, launch.kernel, launch.scale_mode).KERNEL.arg_names
    diffs = []
    for name in arg_names:
        jit_type, ours = src.signature.get(name), inputs.signature.get(name)
        if jit_type != ours:
            diffs.append(f"{name}: JIT {jit_type} vs static {ours}")
    jit_constants = {arg_names[k[0]]: v for k, v in getattr(src, "constants", {}).items() if len(k) == 1}
    for name in sorted(set(jit_constants) | set(inputs.constexprs)):
        if jit_constants.get(name) != inputs.constexprs.get(name):
            diffs.append(f"{name}: JIT constant {jit_constants.get(name)!r} vs static {inputs.constexprs.get(name)!r}")
    jit_attrs = {k: v for k, v in getattr(src, "attrs", {}).items() if v}
    our_attrs = {k: v for k, v in inputs.attrs.items() if v}
    for key in sorted(set(jit_attrs) | set(our_attrs)):
        if jit_attrs.get(key) != our_attrs.get(key):
            diffs.append(f"{arg_names[key[0]]}: JIT attrs {jit_attrs.get(key)} vs static {our_attrs.get(key)}")
    return diffs


def _cpu_figures(launch: static.StaticLaunch) -> dict:
    report = static.report_launch(launch, use_cache=False)
    stack, local = report.extra.get("stack_bytes"), report.extra.get("local_bytes")
    local_total = None if stack is None and local is None else (stack or 0) + (local or 0)
    return {"registers": report.registers, "spill_store_bytes": report.spill, "local_bytes_total": local_total,
            "n_spills_equiv": None if local_total is None else local_total // 4, "shared": report.shared_bytes,
            "mma": report.mma, "problems": list(report.problems), "error": report.error}


def _same(a, b):
    return None if a is None or b is None else a == b


def _launches_of(probe: Probe, arch: str) -> list[static.StaticLaunch]:
    return static.launches_for(arch, probe.kernel, probe.scale_mode, probe.kv_dtype, probe.num_q_heads,
                               probe.num_kv_heads, probe.config)


def _run_probe(probe: Probe, arch: str) -> list[dict]:
    launches = _launches_of(probe, arch)
    jit_fns = {launch.kernel: load_module(arch, launch.kernel, launch.scale_mode).KERNEL for launch in launches}
    before = {kernel: set(_compiled(fn)) for kernel, fn in jit_fns.items()}
    case = _build_case(probe, arch)
    cases.run_kernel(case, config=probe.config)
    torch.cuda.synchronize()
    rows = []
    for launch in launches:
        fn = jit_fns[launch.kernel]
        new = [k for i, k in _compiled(fn).items() if i not in before[launch.kernel]]
        row = {"launch": launch.id, "kernel": launch.kernel}
        if not new:
            row["note"] = "no new compiled kernel found in the JIT cache (compiled earlier in this process?)"
            new = list(_compiled(fn).values())[-1:]
        if len(new) > 1:
            row["note"] = f"{len(new)} new compiled kernels; comparing the last"
        row["gpu"] = _gpu_figures(new[-1]) if new else {}
        row["specialization_diff"] = _specialization_diff(new[-1], launch) if new else ["no compiled kernel"]
        row["cpu"] = _cpu_figures(launch)
        row["match"] = {
            "registers": _same(row["gpu"].get("n_regs"), row["cpu"]["registers"]),
            "spills": _same(row["gpu"].get("n_spills"), row["cpu"]["n_spills_equiv"]),
            "shared": _same(row["gpu"].get("shared"), row["cpu"]["shared"]),
        }
        rows.append(row)
    return rows


def _fmt(value) -> str:
    return "?" if value is None else str(value)


def _print_table(rows: list[dict]) -> None:
    header = ["launch", "regs gpu/cpu", "spills gpu/cpu(/4)", "spill-store B", "shared gpu/cpu", "spec", "match"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        gpu, cpu, match = row.get("gpu", {}), row.get("cpu", {}), row.get("match", {})
        verdict = "error" if "error" in row else (
            "yes" if all(v is not False for v in match.values()) and any(v for v in match.values()) else
            "NO" if any(v is False for v in match.values()) else "?")
        spec = "error" if "error" in row else ("same" if not row.get("specialization_diff") else "DIFF")
        print("| " + " | ".join([
            row["launch"],
            f"{_fmt(gpu.get('n_regs'))}/{_fmt(cpu.get('registers'))}",
            f"{_fmt(gpu.get('n_spills'))}/{_fmt(cpu.get('n_spills_equiv'))}",
            _fmt(cpu.get("spill_store_bytes")),
            f"{_fmt(gpu.get('shared'))}/{_fmt(cpu.get('shared'))}",
            spec, verdict]) + " |")
    for row in rows:
        for diff in row.get("specialization_diff", []):
            print(f"  {row['launch']}: {diff}")
        if row.get("note"):
            print(f"  {row['launch']}: {row['note']}")
        if row.get("error"):
            print(f"  {row['launch']}: ERROR {row['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="compare_resources.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("compare_resources: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from codegen.validate import detect_device_arch

    arch = detect_device_arch(torch.device("cuda"))
    if arch != "sm90":
        print(f"note: device arch is {arch}; this comparison was written for sm90", file=sys.stderr)
    # A private cache folder: the CPU figures must come from a fresh compile, not from another machine.
    os.environ[static.CACHE_ENV] = tempfile.mkdtemp(prefix="msa-static-compare-")
    start = time.perf_counter()
    rows = []
    for probe in PROBES:
        try:
            rows += _run_probe(probe, arch)
        except Exception as exc:  # one failing probe must not hide the others
            rows.append({"launch": f"{probe}", "error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()})
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"ptxas {_read(triton, 'knobs', 'nvidia', 'ptxas', 'path')}, {time.perf_counter() - start:.1f} s")
    _print_table(rows)
    doc = {"triton": triton.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "arch": arch, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {args.out}")
    mismatched = [row for row in rows if any(v is False for v in row.get("match", {}).values())]
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
