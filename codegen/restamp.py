"""Carries a tuned table across a template change that leaves its kernels as they were.

A table is stale when the template inputs of its kernels change (loader._check_stale): its timings
were measured on other code. Some changes do not touch the compiled kernels at all (a new launch
knob whose default takes the old path, a docstring, a refactor of the Python side). For those a
re-tune would measure the same binaries again. `restamp` proves it instead, per table:
  1. the table was fresh at git ref `before` (its recorded hash is that tree's);
  2. every @triton.jit function of the modules it launches has the same source now as at `before`,
     and their `constexprs` (varlen or not, TMA or plain loads) and `options` agree for every config
     (so the launches not compiled below specialize the same too);
  3. for every config of the table (tiled and per-token entries), the launch's compile-time
     parameters and launch options are equal and the PTX / AMDGCN compiled now from both trees is
     identical but for debug information (code_of), with the Triton of this process (run it with the
     Triton the GPU uses).
When a @triton.jit source did change (e.g. a branch under a new compile-time parameter that no
config of the table sets), 2 cannot vouch for the launches 3 does not compile, so every one of
them is compiled from both trees instead: varlen or not (decode), and the plain-load fallback of a
TMA config. Parameters only one side takes are left out of the comparison; those both take must
agree; the compiled text must be identical.
Only then its hash moves to the current one, and its provenance appends to `restamped` (from which
ref and hash, how many kernels compared), so the hash it was tuned under stays on record. The
Python launch code is not compared: a change there is the interpreter tests' to check (e.g. that a
config without the new knob launches as before).

  .venv-static/bin/python -m codegen restamp --before REF|TREE [--file tuned_configs/X.json] [--dry-run]
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import pathlib
import re
import subprocess
import sys
import tempfile

from . import tuned_store
from .configs import LaunchConfig
from .loader import current_inputs_sha256, prefill_parts
from .modules import load_module
from .render import REPO_ROOT
from .variants import Variant, get_arch

_PARTS = {"prefill": ("prefill",), "decode": ("decode_split", "decode_merge")}


@dataclasses.dataclass
class Verdict:
    table: str
    restamped: bool
    reason: str
    kernels_compared: int = 0


def resolve_before(before: str) -> str:
    """A tree folder (holding codegen/generated/) as given, or a git ref as its full commit id."""
    if pathlib.Path(before).is_dir():
        return str(pathlib.Path(before).resolve())
    done = subprocess.run(["git", "rev-parse", "--verify", f"{before}^{{commit}}"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"--before: expected a git ref of this repository or a source tree folder, got {before!r}")
    return done.stdout.strip()


def _module_at(before: str, variant: Variant, tmp: pathlib.Path):
    """The generated module of `variant` in tree folder or commit `before` (resolve_before),
    imported under a private name."""
    rel = f"codegen/generated/{variant.name}.py"
    if pathlib.Path(before).is_dir():
        source = pathlib.Path(before, rel).read_text()
    else:
        done = subprocess.run(["git", "show", f"{before}:{rel}"], cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"--before: {before}:{rel} is not in the repository ({done.stderr.strip()})")
        source = done.stdout
    path = tmp / f"{variant.name}__{hashlib.sha256(before.encode()).hexdigest()[:8]}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"_restamp_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @triton.jit looks its globals up through the module
    spec.loader.exec_module(module)
    return module


def jit_sources(module) -> dict[str, str]:
    """{name: source} of every @triton.jit function a module defines."""
    from triton.runtime.jit import JITFunction

    return {name: inspect.getsource(obj.fn) for name, obj in vars(module).items()
            if isinstance(obj, JITFunction) and obj.fn.__module__ == module.__name__}


def _compiled(launch, module) -> tuple[dict, dict, str]:
    """(constexprs, options, the compiled kernel's text) of `launch` compiled from `module`."""
    from .static.compile import compile_asm, compile_inputs
    from .static.launch import StaticLaunch

    original = StaticLaunch.module
    StaticLaunch.module = lambda self: module
    try:
        inputs = compile_inputs(launch)
        text = compile_asm(launch, "ptx" if launch.arch == "sm90" else "amdgcn")
    finally:
        StaticLaunch.module = original
    return inputs.constexprs, inputs.options, text


def _specializations_equal(launch, old, new) -> bool:
    """The launches the compile does not cover (varlen rows, plain loads where TMA cannot read the
    cache) get the same compile-time parameters and options from both modules."""
    for varlen in (False, True):
        for kv_tma in (False, True):
            kw = dict(num_q_heads=launch.num_q_heads, num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim,
                      topk=launch.topk, config=launch.config, varlen=varlen, use_pdl=launch.use_pdl, kv_tma=kv_tma)
            try:
                if old.constexprs(**kw) != new.constexprs(**kw):
                    return False
            except TypeError:  # one of them takes other arguments
                return False
    return old.options(launch.config) == new.options(launch.config)


def _configs(table: dict) -> list[LaunchConfig]:
    """Every config a table makes the runtime launch: tiled entries and per-token sub-entries."""
    found = {}
    for entry in table["buckets"].values():
        for sub in (entry, entry.get(tuned_store.PER_TOKEN)):
            if sub and "config" in sub:
                config = LaunchConfig.from_dict(sub["config"])
                found[tuple(sorted(config.to_dict().items()))] = config
    return list(found.values())


def check_table(key: str, table: dict, arch: str, before: str, tmp: pathlib.Path) -> Verdict:
    kernel, scale_mode, kv_dtype, hq, hkv = tuned_store.parse_table_key(key)
    now = current_inputs_sha256(arch, kernel, scale_mode)
    recorded = table["provenance"]["inputs_sha256"]
    if recorded == now:
        return Verdict(key, False, "fresh already")
    parts = prefill_parts(arch, scale_mode) if kernel == "prefill" else _PARTS[kernel]
    variants = {part: Variant(arch, part, scale_mode) for part in parts}
    old = {part: _module_at(before, v, tmp) for part, v in variants.items()}
    then = "+".join(old[part].INPUTS_SHA256[:16] for part in parts)
    if recorded != then:
        return Verdict(key, False, f"stale at {before} too (tuned for {recorded}); re-tune it")
    changed = [v.name for part, v in variants.items()
               if jit_sources(old[part]) != jit_sources(load_module(arch, part, scale_mode))]
    compared = 0
    for config in _configs(table):
        for launch in _launches(arch, kernel, scale_mode, kv_dtype, hq, hkv, config, every_specialization=bool(changed)):
            if not changed and not _specializations_equal(launch, old[launch.kernel], launch.module()):
                return Verdict(key, False, f"{launch.kernel} {config.non_default()}: specialized differently "
                                           f"from {before} (varlen or TMA launches); re-tune it", compared)
            if not _same_compile(_compiled(launch, old[launch.kernel]), _compiled(launch, launch.module()),
                                 allow_new_parameters=bool(changed)):
                what = f"; its @triton.jit source changed ({', '.join(changed)})" if changed else ""
                return Verdict(key, False, f"{launch.kernel} {config.non_default()}: compiles differently "
                                           f"from {before}{what}; re-tune it", compared)
            compared += 1
    how = f", every specialization compiled ({', '.join(changed)} changed)" if changed else ""
    return Verdict(key, True, f"{compared} kernels identical to {before}'s{how}", compared)


def _launches(arch, kernel, scale_mode, kv_dtype, hq, hkv, config, *, every_specialization: bool):
    """The launches a config's table entry makes the runtime compile; with every_specialization,
    also its varlen rows (decode) and its plain-load fallback (a TMA config on a cache TMA cannot read;
    the Gluon tile has none: it always reads through TMA)."""
    from .static.launch import launches_for

    configs = [config]
    if every_specialization and config.kv_tma == 1 and get_arch(arch).kv_tma and not config.warp_specialize:
        configs.append(dataclasses.replace(config, kv_tma=0))
    varlens = (False, True) if every_specialization and kernel == "decode" else (False,)
    return [launch for c in configs for varlen in varlens
            for launch in launches_for(arch, kernel, scale_mode, kv_dtype, hq, hkv, c, varlen=varlen)]


def code_of(text: str) -> list[str]:
    """The instructions and directives of PTX / AMDGCN text without its debug information: source
    locations (`.loc`, `.file`, comments) and the debug sections name the file and line a kernel came
    from, which move when a source changes where no instruction does."""
    text = re.split(r"^\s*\.section\s+\.?debug", text, maxsplit=1, flags=re.M)[0]
    lines = (line.split("//")[0].rstrip() for line in text.splitlines())
    return [line for line in lines if line.strip() and not re.match(r"\s*\.(loc|file)\b", line)]


def _same_compile(old, new, *, allow_new_parameters: bool) -> bool:
    """(constexprs, options, text) of two compiles: equal, the text without its debug information;
    with allow_new_parameters, constexprs only one kernel takes are left out (the identical code shows
    they change nothing)."""
    (old_c, old_o, old_t), (new_c, new_o, new_t) = old, new
    if allow_new_parameters:
        common = old_c.keys() & new_c.keys()
        old_c, new_c = {k: old_c[k] for k in common}, {k: new_c[k] for k in common}
    return (old_c, old_o, code_of(old_t)) == (new_c, new_o, code_of(new_t))


def restamp(path: pathlib.Path, before: str, *, dry_run: bool = False) -> list[Verdict]:
    """Checks every table of the tuned file at `path` against `before` (a git ref, or a source tree
    folder); moves the hash of those that pass (unless dry_run) and returns a verdict per table."""
    before = resolve_before(before)
    doc = tuned_store.read_document(path)
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="msa-restamp-") as tmp:
        for key, table in sorted(doc["tables"].items()):
            verdict = check_table(key, table, doc["arch"], before, pathlib.Path(tmp))
            verdicts.append(verdict)
            if verdict.restamped:
                kernel, scale_mode, *_ = tuned_store.parse_table_key(key)
                prov = table["provenance"]
                prov["restamped"] = prov.get("restamped", []) + [dict(
                    from_ref=before, from_inputs_sha256=prov["inputs_sha256"], kernels_compared=verdict.kernels_compared)]
                prov["inputs_sha256"] = current_inputs_sha256(doc["arch"], kernel, scale_mode)
    if not dry_run and any(v.restamped for v in verdicts):
        with tuned_store.locked(path):
            tuned_store.write_document(path, doc)
    return verdicts
