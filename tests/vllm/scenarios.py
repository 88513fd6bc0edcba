"""Scenarios for test_plugin.py, each run in a fresh interpreter of .venv-vllm:
`python tests/vllm/scenarios.py NAME`; exit status 0 and "PASS NAME" when every check holds.

A fresh interpreter per scenario because vLLM loads general plugins once per process and the
plugin's patches stay. Calls run under the Triton interpreter on CPU with fp32 queries.

Two stand-ins, both for import only (no vLLM code is replaced):
- `vllm.models.minimax_m3` is created as a package without running its __init__: that file imports
  the whole model, whose vision processor imports torchvision, and PyPI has only CUDA builds of
  torchvision, which do not load against the CPU torch. The attention modules below it import as
  in a server (through the plugin's import hook when the plugin is on).
- `vllm.platforms.rocm` answers on_gfx950/on_mi3xx with False: the real one asks a ROCm GPU for
  its arch when imported, and amd/ops/sparse_attn.py imports it.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import types

import torch

PKG = "vllm.models.minimax_m3"
SOURCE = f"{PKG}.common.ops.sparse_attn"
AMD = f"{PKG}.amd.ops.sparse_attn"
PREFILL, DECODE = "minimax_m3_sparse_attn", "minimax_m3_sparse_attn_decode"
# Every module of vLLM 0.33.0 that holds the functions (grep of its MiniMax-M3 tree), and what.
HOLDERS = {
    SOURCE: (PREFILL, DECODE),
    f"{PKG}.common.ops": (PREFILL, DECODE),
    f"{PKG}.common.sparse_attention": (PREFILL, DECODE),
    f"{PKG}.nvidia.sparse_attention_msa": (DECODE,),
    AMD: (PREFILL, DECODE),  # its own prefill (ROCm sub-tiled), common's decode
}
SHAPES = dict(num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4, q_dtype=torch.float32)


class Lines(logging.Handler):
    """The plugin's log lines (vLLM's "vllm" logger does not propagate to the root)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


def capture_plugin_log() -> Lines:
    lines = Lines()
    logger = logging.getLogger("vllm.plugins.msa_tune")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    return lines


def load_plugins_like_vllm() -> None:
    names = [ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")]
    assert "msa_tune" in names, f"entry point msa_tune not installed: {names}"
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert "codegen.vllm_plugin" in sys.modules, "vLLM's load_general_plugins did not import the plugin"


def import_attention_modules() -> dict[str, types.ModuleType]:
    if PKG not in sys.modules:  # see the module docstring
        spec = importlib.util.find_spec(PKG)
        sys.modules[PKG] = importlib.util.module_from_spec(spec)
    if "vllm.platforms.rocm" not in sys.modules:
        rocm = types.ModuleType("vllm.platforms.rocm")
        rocm.on_gfx950 = rocm.on_mi3xx = lambda: False
        sys.modules["vllm.platforms.rocm"] = rocm
    return {name: importlib.import_module(name) for name in HOLDERS}


def vllm_functions_held() -> list[str]:
    """Every place in the loaded MiniMax-M3 modules that still holds one of vLLM's own two functions
    (under any attribute name)."""
    held = []
    for mod_name, module in sorted((n, m) for n, m in sys.modules.items() if m is not None and n.startswith(PKG)):
        for attr, value in vars(module).items():
            if (callable(value) and getattr(value, "__name__", None) in (PREFILL, DECODE)
                    and getattr(value, "__module__", "").startswith(PKG)):
                held.append(f"{mod_name}.{attr}")
    return held


def check_all_routed(modules) -> None:
    from codegen import vllm_plugin

    source = modules[SOURCE]
    wrappers = {PREFILL: source.minimax_m3_sparse_attn, DECODE: source.minimax_m3_sparse_attn_decode}
    for name, wrapper in wrappers.items():
        assert wrapper.__module__ == "codegen.vllm_plugin", f"{SOURCE}.{name} is {wrapper.__module__}'s"
        assert wrapper.vllm_original.__module__ == SOURCE
    for mod_name, names in HOLDERS.items():
        for name in names:
            value = getattr(modules[mod_name], name)
            if mod_name == AMD and name == PREFILL:  # AMD's own prefill, wrapped on its own
                assert value.__module__ == "codegen.vllm_plugin" and value.vllm_original.__module__ == AMD, value
            else:
                assert value is wrappers[name], f"{mod_name}.{name} is not msa-tune's: {value!r}"
    assert vllm_functions_held() == [], f"vLLM's functions still held: {vllm_functions_held()}"
    patched = {(m, a) for m, a, _ in vllm_plugin.patcher().holders()}
    expected = {(m, n) for m, names in HOLDERS.items() for n in names}
    assert expected <= patched, f"holders not patched: {expected - patched}"


def forbid_vllm_kernels(source) -> None:
    """Makes vLLM's own Triton kernels fail if launched: a served call must not reach them."""
    for kernel in ("_gqa_sparse_fwd_kernel", "_gqa_sparse_decode_kernel"):
        class Forbidden:
            def __getitem__(self, grid, _name=kernel):
                raise AssertionError(f"vLLM's {_name} was launched for a call msa-tune serves")

        setattr(source, kernel, Forbidden())


def check_accuracy(case, label: str) -> None:
    from codegen.accuracy import compare
    from codegen.cases import run_reference

    result = compare(case.output, run_reference(case), torch.float32)
    print(f"{label}: {result}")
    assert result.ok, f"{label}: {result}"


def scenario_on() -> None:
    """vLLM loads the plugin, then imports MiniMax-M3 (a server's order); calls go to msa-tune."""
    from codegen.cases import decode_case, prefill_case

    lines = capture_plugin_log()
    load_plugins_like_vllm()
    modules = import_attention_modules()
    check_all_routed(modules)
    impl = modules[f"{PKG}.common.sparse_attention"]  # what MiniMaxM3SparseTritonImpl.forward calls
    forbid_vllm_kernels(modules[SOURCE])

    # Prefill: a prefix crossing blocks, a chunk across a block edge, one without prefix; fp8 cache
    # with one-element scales as vLLM's layers hold them (0-d float32 tensors).
    case = prefill_case(arch="sm90", q_lens=[4, 9, 3], prefix_lens=[300, 250, 0], kv_dtype="fp8",
                        scale_mode="scalar", seed=1, **SHAPES)
    a = case.args
    a["k_scale"], a["v_scale"] = a["k_scale"].reshape(()), a["v_scale"].reshape(())
    case.poison()
    # Argument order and keywords exactly as MiniMaxM3SparseTritonImpl.forward passes them.
    returned = impl.minimax_m3_sparse_attn(
        a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["cu_seqlens_q"], a["seq_lens"],
        a["prefix_lens"], a["max_query_len"], a["num_kv_heads"], a["sm_scale"], a["output"],
        k_scale=a["k_scale"], v_scale=a["v_scale"])
    assert returned is None, "vLLM's function returns None"
    check_accuracy(case, "prefill via vllm common.sparse_attention (fp8, scalar scales)")

    # Decode: speculative rows (query length 2), per-token-head scales.
    case = decode_case(arch="sm90", seq_lens=[200, 700, 129], decode_query_len=2, kv_dtype="fp8",
                       scale_mode="per_token_head", seed=2, **SHAPES)
    a = case.args
    case.poison()
    impl.minimax_m3_sparse_attn_decode(
        a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"],
        a["output"], a["decode_query_len"], k_scale=a["k_scale"], v_scale=a["v_scale"])
    check_accuracy(case, "decode via vllm common.sparse_attention (fp8, per-token-head scales)")

    for kernel in ("prefill", "decode"):
        table = lines.having(f"{kernel} on cpu-interpreter (sm90)")
        assert len(table) == 1, f"want one table line for {kernel}: {lines.lines}"
        print(table[0])
    assert not lines.having("stays on vLLM") and not lines.having("refused"), lines.lines

    # A cache msa-tune has no kernels for (fp8 e5m2) goes to vLLM's function, said once. vLLM's
    # Triton kernels cannot run here (without a GPU driver vllm.triton_utils swaps Triton for a
    # placeholder), so a stand-in records their launches instead.
    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.name, args, kwargs))

    for kernel in ("_gqa_sparse_decode_kernel", "_merge_topk_attn_out_kernel"):
        setattr(modules[SOURCE], kernel, Recorder(kernel))
    case = decode_case(arch="sm90", seq_lens=[300, 140], kv_dtype="bf16", scale_mode="none", seed=3, **SHAPES)
    a = case.args
    e5m2 = a["kv_cache"].to(torch.float8_e5m2)
    for _ in range(2):
        impl.minimax_m3_sparse_attn_decode(a["q"], e5m2, a["topk_idx"], a["block_table"], a["seq_lens"],
                                           a["num_kv_heads"], a["sm_scale"], a["output"], 1)
    split = [args for name, args, kwargs in launches if name == "_gqa_sparse_decode_kernel"]
    assert len(split) == 2 and all(args[1] is e5m2 for args in split), launches
    fallback = lines.having("decode stays on vLLM's kernel")
    assert len(fallback) == 1 and "float8_e5m2" in fallback[0], lines.lines
    print(fallback[0])


def scenario_preloaded() -> None:
    """MiniMax-M3 modules imported before the plugin loads: the ones already there are patched too."""
    modules = import_attention_modules()
    assert vllm_functions_held(), "nothing to patch yet"
    load_plugins_like_vllm()
    check_all_routed(modules)


def scenario_off() -> None:
    """MSA_TUNE_VLLM=0: vLLM's functions stay everywhere, no import hook, and the log says why."""
    assert os.environ.get("MSA_TUNE_VLLM") == "0"
    lines = capture_plugin_log()
    load_plugins_like_vllm()
    from codegen import vllm_hook, vllm_plugin

    assert vllm_plugin.patcher() is None
    assert not any(isinstance(f, vllm_hook.PackagePatcher) for f in sys.meta_path)
    modules = import_attention_modules()
    for mod_name, names in HOLDERS.items():
        for name in names:
            value = getattr(modules[mod_name], name)
            assert value.__module__.startswith(PKG) and not hasattr(value, "vllm_original"), f"{mod_name}.{name}"
    assert modules[f"{PKG}.common.sparse_attention"].minimax_m3_sparse_attn_decode is \
        modules[SOURCE].minimax_m3_sparse_attn_decode
    assert len(lines.having("turned off")) == 1, lines.lines
    # Without MSA_TUNE_VLLM_ARCH a machine without a GPU msa-tune serves is refused at load as well.
    os.environ.pop("MSA_TUNE_VLLM_ARCH", None)
    assert "no GPU msa-tune serves" in (vllm_plugin._platform_problem() or "")


SCENARIOS = {"on": scenario_on, "preloaded": scenario_preloaded, "off": scenario_off}

if __name__ == "__main__":
    name = sys.argv[1]
    SCENARIOS[name]()
    print(f"PASS {name}")
