"""Resource reports: limits applied to compiled figures, allowed exceptions, reports over many launches."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import pathlib
from typing import Any, Iterable, Mapping

import torch
import triton

from ..configs import LaunchConfig
from ..variants import KERNELS
from .cache import _cache_load, cached_figures
from .compile import CompileInputs, compile_inputs
from .launch import COMPILE_SECONDS_LIMIT, EXCEPTIONS_PATH, LIMITS, StaticLaunch, _as_config, config_label, launches_for, runtime_use_pdl, target_of
from .shipped import shipped_launches

# ---------------------------------------------------------------------------------------------
# Reports


@dataclasses.dataclass(frozen=True)
class ResourceReport:
    """Resource figures of one compiled kernel and the limits it violates (`problems`)."""

    variant: str
    arch: str
    kernel: str
    scale_mode: str
    kv_dtype: str
    q_dtype: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    topk: int
    varlen: bool
    use_pdl: bool
    source: str
    config: dict
    constexprs: dict
    options: dict
    registers: int | None  # sm90: per thread; gfx942: VGPRs per wave, arch + acc (AGPR) together
    spill: int | None  # sm90: bytes of spill stores; gfx942: number of spilled VGPRs
    spill_unit: str  # "bytes" | "count"
    scratch_bytes: int | None  # sm90: stack + local memory per thread; gfx942: scratch per lane
    shared_bytes: int | None  # sm90: dynamic shared memory per block; gfx942: LDS per workgroup
    occupancy: int | None  # gfx942: waves per SIMD as the compiler reports it; sm90: None
    vgpr: int | None  # gfx942: architectural VGPRs
    agpr: int | None  # gfx942: accumulation VGPRs
    mma: str  # "wgmma" | "mma.sync" | "wgmma+mma.sync" | "mfma" | "none"
    triton_version: str
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()
    extra: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    cached: bool = False
    compile_seconds: float | None = None
    compile_key: str = ""
    launch_id: str = ""
    also_kv_dtypes: tuple[str, ...] = ()  # other KV dtypes / head layouts that compile identically
    also_heads: tuple[str, ...] = ()
    fold_scales: bool = True  # False: the unfolded scalar baseline module (variant name ends in _unfolded)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def heads(self) -> str:
        return f"{self.num_q_heads}/{self.num_kv_heads}"

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["problems"] = list(self.problems)
        data["notes"] = list(self.notes)
        data["also_kv_dtypes"] = list(self.also_kv_dtypes)
        data["also_heads"] = list(self.also_heads)
        data["ok"] = self.ok
        return data

    def summary(self) -> str:
        """One line naming the kernel and every figure (used in failure messages)."""
        regs = f"{self.registers}" + (f" (vgpr {self.vgpr}, agpr {self.agpr})" if self.arch == "gfx942" else "")
        return (f"{self.launch_id}: registers {regs}, spill {self.spill} {self.spill_unit}, "
                f"scratch {self.scratch_bytes} B, {LIMITS[self.arch].shared_name} {self.shared_bytes} B, "
                f"occupancy {self.occupancy}, mma {self.mma}, triton {self.triton_version}"
                + (f"; problems: {'; '.join(self.problems)}" if self.problems else "; ok"))


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KB ({n} B)"


def problems_of(arch: str, figures: Mapping[str, Any]) -> list[str]:
    """Every limit violation in `figures`, each naming the figure and the limit."""
    limits = LIMITS[arch]
    if figures.get("error"):
        return [f"compile failed: {figures['error']}"]
    found = []
    seconds = figures.get("compile_seconds")
    if seconds is not None and seconds > COMPILE_SECONDS_LIMIT:
        found.append(f"compile time {seconds:.1f} s > limit {COMPILE_SECONDS_LIMIT:g} s (Triton + ptxas)")
    shared = figures.get("shared_bytes")
    if shared is not None and shared > limits.shared_bytes:
        found.append(f"{limits.shared_name} {_kb(shared)} > limit {_kb(limits.shared_bytes)}")
    registers = figures.get("registers")
    if registers is not None and registers > limits.registers:
        found.append(f"registers {registers} > limit {limits.registers} {limits.register_unit}")
    spill = figures.get("spill")
    if spill:
        what = "bytes of spill stores" if figures.get("spill_unit") == "bytes" else "VGPRs spilled"
        found.append(f"register spills: {spill} {what} (limit 0)")
    scratch = figures.get("scratch_bytes")
    if scratch and not spill:  # scratch without spills: local arrays or stack use, still memory traffic
        found.append(f"scratch/local memory {scratch} B per thread (limit 0)")
    if registers is None or shared is None:
        found.append("figures missing: could not read registers or shared memory from the compiled kernel")
    return found


def _report_from(inputs: CompileInputs, figures: dict, cached: bool) -> ResourceReport:
    launch = inputs.launch
    return ResourceReport(
        variant=launch.variant, arch=launch.arch, kernel=launch.kernel, scale_mode=launch.scale_mode,
        kv_dtype=launch.kv_dtype, q_dtype=launch.q_dtype, num_q_heads=launch.num_q_heads,
        num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim, topk=launch.topk, varlen=launch.varlen,
        use_pdl=launch.use_pdl, source=launch.source, config=launch.config.to_dict(),
        constexprs={k: v for k, v in inputs.constexprs.items()}, options=dict(inputs.options),
        registers=figures.get("registers"), spill=figures.get("spill"),
        spill_unit=figures.get("spill_unit", "bytes" if launch.arch == "sm90" else "count"),
        scratch_bytes=figures.get("scratch_bytes"), shared_bytes=figures.get("shared_bytes"),
        occupancy=figures.get("occupancy"), vgpr=figures.get("vgpr"), agpr=figures.get("agpr"),
        mma=figures.get("mma", "none"), triton_version=triton.__version__,
        problems=tuple(problems_of(launch.arch, figures)),
        notes=tuple(inputs.notes) + tuple(figures.get("notes", ())), extra=dict(figures.get("extra", {})),
        error=figures.get("error"), cached=cached, compile_seconds=figures.get("compile_seconds"),
        compile_key=inputs.key, launch_id=launch.id, also_kv_dtypes=launch.also_kv_dtypes,
        also_heads=launch.also_heads, fold_scales=launch.fold_scales,
    )


def report_launch(launch: StaticLaunch, *, options: Mapping[str, Any] | None = None,
                  use_cache: bool = True) -> ResourceReport:
    """Compiles (or looks up) one StaticLaunch and checks it against its target's limits."""
    inputs = compile_inputs(launch, options)
    figures, cached = cached_figures(inputs, use_cache=use_cache)
    return _report_from(inputs, figures, cached)


def compile_report(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                   config, *, head_dim: int = 128, topk: int = 16, q_dtype: str = "bf16", varlen: bool = False,
                   use_pdl: bool | None = None, options: Mapping[str, Any] | None = None,
                   use_cache: bool = True, fold_scales: bool = True) -> ResourceReport:
    """Compiles one generated kernel ahead of time for `arch` and returns its resource report.

    kernel: "prefill" | "prefill_ws" (a warp_specialize config, e.g. configs.ws_config) | "decode_split" |
    "decode_merge"; kv_dtype: "fp8" | "bf16" | "fp16";
    config: a LaunchConfig or a mapping of its fields. use_pdl: None = what the runtime does (on
    for sm90 decode kernels). options: extra compile options over the module's own, validated
    by name against the backend (a misspelled option is a ValueError). fold_scales=False: the
    unfolded scalar baseline module (scale_mode "scalar" only). Raises ValueError/TypeError
    on invalid arguments; a kernel that fails to compile gives a report whose `problems` say so.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    launch = StaticLaunch(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads, _as_config(config),
                          head_dim=head_dim, topk=topk, q_dtype=q_dtype, varlen=varlen,
                          use_pdl=runtime_use_pdl(arch, kernel) if use_pdl is None else use_pdl,
                          fold_scales=fold_scales)
    return report_launch(launch, options=options, use_cache=use_cache)


def check_launch(arch: str, kernel: str, scale_mode: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int,
                 config, *, fold_scales: bool = True, **kw) -> list[ResourceReport]:
    """Reports for every kernel one runtime call launches (kernel: "prefill" | "decode").

    prefill = the prefill module's tile, or prefill_ws's for a warp_specialize config; decode =
    decode_split, plus decode_merge when config.launches_merge (sm90 with use_pdl, as the runtime).
    Keywords: head_dim, topk, q_dtype, varlen, fold_scales (False: the unfolded scalar
    baseline), options, use_cache. The launch fits when
    ``all(r.ok for r in reports)``; otherwise each report's `problems` say which figure broke
    which limit (the tuner records them as the reason to drop the candidate).
    """
    options = kw.pop("options", None)
    use_cache = kw.pop("use_cache", True)
    return [report_launch(launch, options=options, use_cache=use_cache)
            for launch in launches_for(arch, kernel, scale_mode, kv_dtype, num_q_heads, num_kv_heads, config,
                                       fold_scales=fold_scales, **kw)]



# ---------------------------------------------------------------------------------------------
# Allowed exceptions


_EXCEPTION_MATCH_KEYS = ("arch", "kernel", "scale_mode", "fold_scales", "kv_dtype", "heads", "config", "problem")


def load_exceptions(path: pathlib.Path | None = None) -> list[dict]:
    """The allowed exceptions: a JSON object {"exceptions": [...]} (or a bare list).

    Each entry matches reports by any of arch, kernel, scale_mode, fold_scales (false: the
    unfolded baseline), kv_dtype, heads ("64/4"), config (a subset of the config's fields) and
    problem (a substring of the problem text), and must give a non-empty "reason".
    """
    path = EXCEPTIONS_PATH if path is None else pathlib.Path(path)
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    entries = doc.get("exceptions") if isinstance(doc, dict) else doc
    if not isinstance(entries, list):
        raise ValueError(f"{path.name}: expected {{\"exceptions\": [...]}} or a list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{path.name}[{i}]: expected an object")
        unknown = sorted(set(entry) - set(_EXCEPTION_MATCH_KEYS) - {"reason"})
        if unknown:
            raise ValueError(f"{path.name}[{i}]: unknown key(s) {unknown}; expected {_EXCEPTION_MATCH_KEYS} + reason")
        if not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path.name}[{i}]: every exception needs a non-empty \"reason\"")
    return entries


def _exception_matches(entry: dict, report: ResourceReport, problem: str) -> bool:
    for key in ("arch", "kernel", "scale_mode", "fold_scales", "kv_dtype"):
        if key in entry and entry[key] != getattr(report, key):
            return False
    if "heads" in entry and entry["heads"] != report.heads:
        return False
    if any(report.config.get(k) != v for k, v in entry.get("config", {}).items()):
        return False
    return entry.get("problem", "") in problem


def split_problems(report: ResourceReport, exceptions: list[dict]) -> tuple[list[str], list[str]]:
    """(unexcused problems, reasons of the exceptions that excuse the others)."""
    unexcused, reasons = [], []
    for problem in report.problems:
        entry = next((e for e in exceptions if _exception_matches(e, report, problem)), None)
        if entry is None:
            unexcused.append(problem)
        else:
            reasons.append(entry["reason"])
    return unexcused, reasons


# ---------------------------------------------------------------------------------------------
# Reports over many launches


def _worker_figures(launch: StaticLaunch, use_cache: bool) -> dict:
    return cached_figures(compile_inputs(launch), use_cache=use_cache)[0]


def _invalid_report(launch: StaticLaunch, exc: Exception) -> ResourceReport:
    """A report for a launch that cannot even be set up (e.g. an invalid tuned config)."""
    return ResourceReport(
        variant=launch.variant, arch=launch.arch, kernel=launch.kernel, scale_mode=launch.scale_mode,
        kv_dtype=launch.kv_dtype, q_dtype=launch.q_dtype, num_q_heads=launch.num_q_heads,
        num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim, topk=launch.topk, varlen=launch.varlen,
        use_pdl=launch.use_pdl, source=launch.source, config=launch.config.to_dict(), constexprs={}, options={},
        registers=None, spill=None, spill_unit="", scratch_bytes=None, shared_bytes=None, occupancy=None,
        vgpr=None, agpr=None, mma="none", triton_version=triton.__version__,
        problems=(f"invalid launch: {exc}",), error=str(exc), launch_id=launch.id, fold_scales=launch.fold_scales)


def report_many(launches: Iterable[StaticLaunch], *, jobs: int | None = None,
                use_cache: bool = True) -> list[ResourceReport]:
    """Reports for `launches` in order; cache misses compile in a process pool of `jobs` workers
    (default: one per core). A launch that cannot be set up gets a report saying why."""
    prepared: list[CompileInputs | ResourceReport] = []
    for launch in launches:
        try:
            prepared.append(compile_inputs(launch))
        except (TypeError, ValueError) as exc:
            prepared.append(_invalid_report(launch, exc))
    inputs = [item for item in prepared if isinstance(item, CompileInputs)]
    figures, cached = {}, {}
    for item in inputs:
        hit = _cache_load(item) if use_cache else None
        if hit is not None:
            figures[item.key], cached[item.key] = hit, True
    todo = {item.key: item.launch for item in inputs if item.key not in figures}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    if jobs == 1:
        for key, launch in todo.items():
            figures[key], cached[key] = _worker_figures(launch, use_cache), False
    elif todo:
        # spawn, not fork: triton/LLVM state in this process is not fork-safe.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {key: pool.submit(_worker_figures, launch, use_cache) for key, launch in todo.items()}
            for key, future in futures.items():
                figures[key], cached[key] = future.result(), False
    return [item if isinstance(item, ResourceReport) else _report_from(item, figures[item.key], cached[item.key])
            for item in prepared]


def _fmt(value, unit: str = "", missing: str = "?") -> str:
    return missing if value is None else f"{value}{unit}"


def report_rows(reports: Iterable[ResourceReport], exceptions: list[dict] | None = None) -> list[dict]:
    """JSON-ready rows: each report's fields plus status ("ok" | "excepted" | "FAIL")."""
    exceptions = load_exceptions() if exceptions is None else exceptions
    rows = []
    for report in reports:
        unexcused, reasons = split_problems(report, exceptions)
        status = "FAIL" if unexcused else ("excepted" if report.problems else "ok")
        rows.append(dict(report.to_dict(), status=status, unexcused_problems=unexcused, exception_reasons=reasons))
    return rows


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


def _row_cells(row: dict) -> list[str]:
    arch = row["arch"]
    regs = _fmt(row["registers"])
    if arch == "gfx942":
        regs += f" (a{_fmt(row['agpr'])})"
    spill = _fmt(row["spill"], " B" if row["spill_unit"] == "bytes" else "")
    shared = _size(row["shared_bytes"])
    status = row["status"]
    if row["problems"]:
        status += ": " + "; ".join(row["problems"])
    kv_dtypes = ", ".join([row["kv_dtype"], *row.get("also_kv_dtypes", ())])
    heads = ", ".join([f"{row['num_q_heads']}/{row['num_kv_heads']}", *row.get("also_heads", ())])
    scale = row["scale_mode"] + ("" if row.get("fold_scales", True) else " unfolded")
    return [arch, row["kernel"], scale, kv_dtypes, heads,
            config_label(arch, row["kernel"], LaunchConfig(**row["config"])), row.get("source", ""), regs, spill,
            _fmt(row["scratch_bytes"], " B"), shared,
            _fmt(row["occupancy"], missing="-" if arch == "sm90" else "?"), row["mma"],
            _fmt(row.get("compile_seconds"), " s"), status]


TABLE_HEADER = ["arch", "kernel", "scale", "kv", "heads", "config", "source", "regs", "spill", "scratch", "smem/LDS", "occ",
                "mma", "compile", "status"]


def table_text(rows: list[dict]) -> str:
    """A Markdown table (readable as plain text too) of `rows`, preceded by the limits and version."""
    lines = [f"Triton {triton.__version__}. Limits: "
             + "; ".join(f"{arch}: {LIMITS[arch].describe()}" for arch in LIMITS) + ".",
             "regs: sm90 per thread; gfx942 VGPRs per wave incl. AGPRs (aN = AGPRs). spill: sm90 bytes of "
             "spill stores, gfx942 spilled VGPRs. occ: gfx942 waves per SIMD. compile: seconds of the compile "
             f"(Triton + ptxas) when the figures were measured, limit {COMPILE_SECONDS_LIMIT:g} s.", "",
             "| " + " | ".join(TABLE_HEADER) + " |", "|" + "|".join("---" for _ in TABLE_HEADER) + "|"]
    lines += ["| " + " | ".join(_row_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def report(launches: Iterable[StaticLaunch] | None = None, *, jobs: int | None = None, use_cache: bool = True,
           exceptions: list[dict] | None = None) -> tuple[list[dict], str]:
    """(rows, table text) over `launches` (default: everything shipped)."""
    launches = shipped_launches() if launches is None else launches
    rows = report_rows(report_many(launches, jobs=jobs, use_cache=use_cache), exceptions)
    return rows, table_text(rows)


def write_json(path, rows: list[dict], *, command: str | None = None) -> None:
    """Writes the rows with the Triton version and the limits they were checked against."""
    doc = {
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "command": command,
        "limits": {arch: dataclasses.asdict(limits) for arch, limits in LIMITS.items()},
        "targets": {arch: repr(target_of(arch)) for arch in LIMITS},
        "rows": rows,
    }
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")

