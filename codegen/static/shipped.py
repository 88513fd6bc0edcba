"""Every shipped (module, config) the gate covers: arch defaults, design options, tuned configs."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import warnings
from typing import Any, Iterable


from ..configs import LaunchConfig, default_config, ws_config
from ..variants import ARCHS, WS_SCALE_MODES
from .compile import compile_inputs
from ..shapes import SERVING_LAYOUTS
from .launch import DECODE_TOKEN_COUNTS, SHIPPED_MODES, SHIPPED_UNFOLDED_MODES, StaticLaunch, TUNED_DIR, launches_for

# ---------------------------------------------------------------------------------------------
# Everything shipped

# The warp-specialized tile's convert_rows gated by design (before any table picks one): those that
# compile without spills at every serving layout with Triton 3.6 (at TP1 64/4, scalar 64 spills 170 B,
# per_token_head 32 4 B and 64 104 B; a tuned table's other values are gated at its own layout).
WS_DESIGN_CONVERT_ROWS = {"scalar": (16, 32), "per_token_head": (16,)}


def _default_launches() -> list[StaticLaunch]:
    launches = []
    modes = [(mode, kv, True) for mode, kv in SHIPPED_MODES] + [(mode, kv, False) for mode, kv in SHIPPED_UNFOLDED_MODES]
    for arch in ARCHS:
        for scale_mode, kv_dtype, fold_scales in modes:
            for _, (hq, hkv) in sorted(SERVING_LAYOUTS.items()):
                config = default_config(arch, "prefill", num_tokens=1, num_kv_heads=hkv)
                launches += launches_for(arch, "prefill", scale_mode, kv_dtype, hq, hkv, config, source="default",
                                         fold_scales=fold_scales)
                for tokens in DECODE_TOKEN_COUNTS:
                    config = default_config(arch, "decode", num_tokens=tokens, num_kv_heads=hkv)
                    launches += launches_for(arch, "decode", scale_mode, kv_dtype, hq, hkv, config,
                                             source=f"default@{tokens}tok", fold_scales=fold_scales)
    return launches + _design_launches()


def _design_launches() -> list[StaticLaunch]:
    """The launch options no default uses but the tuner may pick (fp8 upcast paths, the fused
    decode merge, v_early), compiled once per arch and fp8 scale mode at the TP4 layout (16/1); and the
    warp-specialized prefill tile (_ws_design_launches)."""
    launches = []
    for arch in ARCHS:
        for scale_mode in ("scalar", "per_token_head"):
            base = default_config(arch, "prefill", num_tokens=1, num_kv_heads=1)
            for upcast in (1, 2, 3) if ARCHS[arch].fp8_cvt_asm else (1, 2):
                launches += launches_for(arch, "prefill", scale_mode, "fp8", 16, 1,
                                         dataclasses.replace(base, kv_upcast=upcast), source="design")
            base = dataclasses.replace(default_config(arch, "decode", num_tokens=1, num_kv_heads=1), num_splits=4,
                                       fused_merge=1)
            for upcast in (0, 2, 3) if ARCHS[arch].fp8_cvt_asm else (0, 2):
                launches += launches_for(arch, "decode", scale_mode, "fp8", 16, 1,
                                         dataclasses.replace(base, kv_upcast=upcast), source="design")
            # v_early (V beside K, unpipelined): a one-slice program, the form the candidate lists hold.
            one_slice = dataclasses.replace(base, block_n=128, num_warps=8, num_stages=1, num_splits=16,
                                            kv_upcast=3 if ARCHS[arch].fp8_cvt_asm else 0, v_early=1)
            launches += launches_for(arch, "decode", scale_mode, "fp8", 16, 1, one_slice, source="design")
    return launches + _ws_design_launches()


def _ws_design_launches() -> list[StaticLaunch]:
    """The warp-specialized prefill tile (prefill_ws) at every serving layout (block_t = 128 // GQA:
    8 at TP1 and TP4, GQA 16; 16 at TP8, GQA 8) and its non-spilling convert_rows, on the archs that have it."""
    launches = []
    for arch in (arch for arch, spec in ARCHS.items() if spec.gluon_ws):
        for scale_mode in WS_SCALE_MODES:
            for _, (hq, hkv) in sorted(SERVING_LAYOUTS.items()):
                for convert_rows in WS_DESIGN_CONVERT_ROWS[scale_mode]:
                    config = ws_config(gqa=hq // hkv, convert_rows=convert_rows)
                    launches += launches_for(arch, "prefill", scale_mode, "fp8", hq, hkv, config, source="design")
    return launches


_TABLE_KEY = re.compile(r"(prefill|decode)/([a-z_]+)/([a-z0-9]+)/(\d+)x(\d+)")
_ENTRY_KEYS = ("kernel", "scale_mode", "kv_dtype", "num_q_heads", "num_kv_heads")


def _tuned_entries(node, context: dict, where: str):
    """Yields (context, config dict, where) for every dict holding a "config" dict, depth first.

    The schema of tuned_configs/ is not final, so the fields an entry needs may sit on the entry
    itself, on any enclosing object, or in a "<kernel>/<scale_mode>/<kv_dtype>/<Hq>x<Hkv>" key.
    """
    if isinstance(node, dict):
        context = dict(context)
        for key in ("arch", "head_dim", "topk", *_ENTRY_KEYS):
            if key in node and not isinstance(node[key], (dict, list)):
                context[key] = node[key]
        if isinstance(node.get("config"), dict):
            yield context, node["config"], where
        for key, child in node.items():
            if key == "config" or not isinstance(child, (dict, list)):
                continue
            child_context = context
            match = _TABLE_KEY.fullmatch(str(key))
            if match:
                child_context = dict(context, kernel=match[1], scale_mode=match[2], kv_dtype=match[3],
                                     num_q_heads=int(match[4]), num_kv_heads=int(match[5]))
            yield from _tuned_entries(child, child_context, f"{where}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _tuned_entries(child, context, f"{where}[{i}]")


def tuned_launches(folder: pathlib.Path | None = None) -> list[StaticLaunch]:
    """Launches of every config in tuned_configs/*.json; unreadable entries are skipped with a warning."""
    folder = TUNED_DIR if folder is None else pathlib.Path(folder)
    launches = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path.name}: not readable JSON ({exc}); skipped")
            continue
        file_arch = path.name.split("__")[0] if path.name.split("__")[0] in ARCHS else None
        for context, config, where in _tuned_entries(doc, {"arch": file_arch} if file_arch else {}, path.name):
            missing = [k for k in ("arch", *_ENTRY_KEYS) if context.get(k) is None]
            if missing:
                warnings.warn(f"{where}: tuned entry without {missing}; skipped")
                continue
            kernel = "decode" if str(context["kernel"]).startswith("decode") else context["kernel"]
            try:
                launches += launches_for(
                    context["arch"], kernel, context["scale_mode"], context["kv_dtype"],
                    int(context["num_q_heads"]), int(context["num_kv_heads"]), LaunchConfig.from_dict(config),
                    head_dim=int(context.get("head_dim", 128)), topk=int(context.get("topk", 16)),
                    source=f"tuned:{path.name}")
            except (TypeError, ValueError) as exc:
                warnings.warn(f"{where}: {exc}; skipped")
    return launches


def _merged(kept: StaticLaunch, other: StaticLaunch) -> StaticLaunch:
    """`kept`, noting that `other` (another KV dtype or head layout) compiles to the same kernel."""
    kv = kept.also_kv_dtypes + ((other.kv_dtype,) if other.kv_dtype not in (kept.kv_dtype, *kept.also_kv_dtypes)
                                else ())
    heads = kept.also_heads + ((other.heads,) if other.heads not in (kept.heads, *kept.also_heads) else ())
    return dataclasses.replace(kept, also_kv_dtypes=kv, also_heads=heads)


def _dedupe(launches: Iterable[StaticLaunch]) -> list[StaticLaunch]:
    """One launch per distinct compile (e.g. the merge kernel ignores the KV dtype, and 64/4 and
    16/1 heads give the same constexprs and specializations); the first one notes the others."""
    unique: dict[Any, StaticLaunch] = {}
    for launch in launches:
        try:
            key = compile_inputs(launch).key
        except (TypeError, ValueError):  # invalid: keep it, so the gate reports it
            key = launch
        unique[key] = _merged(unique[key], launch) if key in unique else launch
    return list(unique.values())


def shipped_launches(tuned_folder: pathlib.Path | None = None) -> list[StaticLaunch]:
    """Every shipped (module, config) to gate, one per distinct compile.

    Each arch x {prefill, decode} x scale modes {scalar: fp8, per_token_head: fp8, none: bf16
    and fp8; plus the unfolded scalar baseline, fold_scales=False: fp8} x head layouts TP1 (64/4),
    TP4 (16/1), TP8 (8/1) with the arch default config (decode at DECODE_TOKEN_COUNTS tokens, so
    every split count the default picks is covered), plus the design options no default uses (kv_upcast
    paths, the fused merge, the warp-specialized prefill tile prefill_ws), plus every config in
    tuned_configs/*.json (a warp_specialize config compiles the prefill_ws module).
    """
    return _dedupe(_default_launches() + tuned_launches(tuned_folder))


