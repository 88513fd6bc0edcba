"""Runtime API: drop-in for vLLM's MiniMax-M3 sparse-attention wrappers, over the generated modules.

A call looks its plan up by the shapes, dtypes, strides and devices of its arguments
(codegen.plan): the first call of a shape validates, resolves the config and binds the launches;
the next calls of that shape (the other layers of a step, the next steps) only fill in their
tensors and launch."""
from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Mapping

import torch

from . import plan as call_plans
from . import selection as tile_selection
from . import selection_kernel
from . import tuned_store, validate, value_checks
from .bound_launch import bind_recorded
from .configs import LaunchConfig, check_kv_upcast, default_config, per_token_twin, validate_config
from .loader import TableStamp, get_config
from .modules import load_module
from .variants import WS_SCALE_MODES, has_variant
from .workspace import call_counters


def _check_fold(fold_scales, scale_mode: str) -> None:
    if not isinstance(fold_scales, bool):
        raise TypeError(f"fold_scales: expected a bool, got {type(fold_scales).__name__}")
    if not fold_scales and scale_mode != "scalar":
        raise ValueError(f"fold_scales: False (the unfolded baseline) exists for scalar scales only, "
                         f"these arguments are scale mode {scale_mode!r}")


def device_name(device: torch.device) -> str:
    """The name the tuned-config files are keyed by: the GPU's, or "cpu-interpreter" on a CPU."""
    return "cpu-interpreter" if device.type == "cpu" else torch.cuda.get_device_name(device)


def _resolve_config(config, *, kernel, arch, scale_mode, q, kv_cache, num_kv_heads, topk,
                    per_token=False) -> LaunchConfig:
    if config is None:
        config = get_config(kernel, arch, device_name(q.device), scale_mode, tuned_store.kv_dtype_name(kv_cache.dtype),
                            q.shape[1], num_kv_heads, q.shape[0], topk, per_token=per_token).config
    elif isinstance(config, Mapping):
        config = LaunchConfig.from_dict(config)
    validate_config(config, arch=arch, kernel=kernel, topk=topk)
    check_kv_upcast(config, kv_cache.dtype)
    return config


def _check_warp_specialize(config, explicit, *, arch, scale_mode, fold_scales, q, kv_cache, num_kv_heads,
                           output) -> LaunchConfig:
    """A warp_specialize config as the call can run it. The Gluon tile exists for sm90's fp8 scale
    modes (variants.WS_SCALE_MODES) and the shapes its module accepts (`unsupported`); a given config
    that cannot run raises, a table's falls back to the arch's default tile (tables are measured on
    vLLM's layouts; another layout, the unfolded baseline or the interpreter may not fit it)."""
    if q.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        why = "a GPU (Gluon kernels do not run under the Triton interpreter)"
    elif not has_variant(arch, "prefill_ws", scale_mode, fold_scales):
        why = (f"an fp8 cache with scales {WS_SCALE_MODES}{'' if fold_scales else ' folded'} on sm90, "
               f"got scale mode {scale_mode!r} on {arch}")
    else:
        why = load_module(arch, "prefill_ws", scale_mode).unsupported(
            q=q, kv_cache=kv_cache, num_kv_heads=num_kv_heads, output=output, config=config)
    if why is None:
        return config
    if explicit:
        raise ValueError(f"config.warp_specialize: 1 needs {why}")
    if why not in _WS_FALLBACKS_SAID:  # said once a reason: a plan is built once a shape
        _WS_FALLBACKS_SAID.add(why)
        warnings.warn(f"msa-tune: the tuned prefill config runs the Gluon tile (warp_specialize 1), which needs "
                      f"{why}; these calls run the arch default instead", RuntimeWarning, stacklevel=4)
    return default_config(arch, "prefill", num_tokens=q.shape[0], num_kv_heads=num_kv_heads)


_WS_FALLBACKS_SAID: set = set()


def _use_pdl(q: torch.Tensor) -> bool:
    # PDL needs a real Hopper launch; the interpreter has no griddepcontrol.
    return q.device.type == "cuda" and not torch.version.hip and os.environ.get("TRITON_INTERPRET") != "1"


# The call's tensors in the order plans address them (codegen.plan: slots by role).
# The layer's tensors first (codegen.plan.LAYER_TENSORS of them), then the step's metadata.
PREFILL_ROLES = ("q", "kv_cache", "topk_idx", "output", "k_scale", "v_scale", "block_table", "cu_seqlens_q",
                 "seq_lens", "prefix_lens")
DECODE_ROLES = ("q", "kv_cache", "topk_idx", "output", "k_scale", "v_scale", "block_table", "seq_lens",
                "query_start_loc", "token_to_req_indices")


def sparse_attn_prefill(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
                        num_kv_heads, sm_scale, output, k_scale=None, v_scale=None, *, arch=None, config=None,
                        fold_scales=True, selection=None, max_seq_len=None):
    """Block-sparse GQA prefill over the paged cache; writes and returns `output` ([total_q, Hq, D]).

    selection: "tiled" runs the config as chosen (tuned on selections neighbouring tokens share);
    "per_token" the per-token path (block_t 1: a given config must be one); "auto" decides on the
    device, per call, from how much the selections overlap (codegen.selection), without a host
    sync: when the tiled config has block_t > 1, both paths are launched and the one not chosen
    exits at once. With the table's configs (config=None), a short prefill whose shapes fall in the
    measured per-token region (max_query_len, request count, head layout (q heads, KV heads), scale
    mode, arch: selection.PER_TOKEN_UP_TO) is decided on the host instead: the per-token launch alone, as
    "per_token" runs it. None (the default): "auto" when the config comes from the loader, "tiled"
    when one is given (a given config runs as given). max_seq_len: optional, a bound on every
    request's length (prefix + new tokens) that the caller holds on the host (vLLM's and FlashAttention's
    max_seqlen_k); when it is at most topk pages, every token reads all its causal blocks and "auto"
    takes the tiles on the host, with no device decision and no emptied per-token launch
    (selection.tiles_on_host). Only the path depends on it, never the result. fold_scales=False runs
    the seed's unfolded scalar-scale baseline (for benchmarks)."""
    if value_checks.values_checked():  # opt-in (MSA_TUNE_CHECK_VALUES=1): every call, a device sync
        value_checks.check_prefill_call(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens,
                                        max_query_len, num_kv_heads, sm_scale, output, k_scale, v_scale, arch=arch)
    tensors = (q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, cu_seqlens_q, seq_lens, prefix_lens)
    key, cacheable, stream, pointers = call_plans.call_key("prefill", tensors, (max_query_len, num_kv_heads, sm_scale),
                                                           (arch, config, fold_scales, selection, max_seq_len))
    plan = call_plans.PLANS.get(key) if cacheable else None
    if plan is not None:
        plan.run(tensors, pointers, stream)
        return output
    plan = _plan_prefill(tensors, max_query_len, num_kv_heads, sm_scale, arch=arch, config=config,
                         fold_scales=fold_scales, selection=selection, max_seq_len=max_seq_len,
                         capturing=not cacheable)
    if cacheable:
        call_plans.PLANS.put(key, plan)
    return output


def _plan_prefill(tensors, max_query_len, num_kv_heads, sm_scale, *, arch, config, fold_scales, selection,
                  max_seq_len=None, capturing=False):
    """Validates a prefill call, resolves its configs, records and binds its launches, runs them once."""
    q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, cu_seqlens_q, seq_lens, prefix_lens = tensors
    num_requests = validate.check_prefill_metadata(q, cu_seqlens_q, seq_lens, prefix_lens, max_query_len, block_table)
    validate.check_max_seq_len(max_seq_len, max_query_len)
    arch, scale_mode = validate.check_common(arch, q, kv_cache, topk_idx, num_kv_heads, sm_scale, output,
                                             k_scale, v_scale)
    _check_fold(fold_scales, scale_mode)
    if selection is None:
        selection = "auto" if config is None else "tiled"
    tile_selection.check_selection(selection)
    if selection == "auto" and config is None and tile_selection.per_token_on_host(
            arch, scale_mode, q.shape[1], num_kv_heads, num_requests, max_query_len):
        selection = "per_token"  # a short prefill: the per-token walk alone, known on the host (PER_TOKEN_UP_TO)
    elif selection == "auto" and tile_selection.tiles_on_host(max_seq_len, topk_idx.shape[2]):
        selection = "tiled"  # every token reads all its causal blocks: the tiles share them (tiles_on_host)
    stamp = TableStamp(arch, device_name(q.device)) if config is None else None
    resolve = functools.partial(_resolve_config, kernel="prefill", arch=arch, scale_mode=scale_mode, q=q,
                                kv_cache=kv_cache, num_kv_heads=num_kv_heads, topk=topk_idx.shape[2])
    per_token = None
    if selection == "per_token":
        config = resolve(config, per_token=True)
        if config.block_t != 1:
            raise ValueError(f"config.block_t: selection='per_token' needs 1, got {config.block_t}")
    else:
        explicit = config is not None
        config = resolve(config)
        if config.warp_specialize:
            config = _check_warp_specialize(config, explicit, arch=arch, scale_mode=scale_mode,
                                            fold_scales=fold_scales, q=q, kv_cache=kv_cache,
                                            num_kv_heads=num_kv_heads, output=output)
        if selection == "auto" and config.block_t > 1:
            # A given config's per-token twin; else the table's per-token config for this shape (its
            # per_token sub-entry, or the twin of its config: loader.get_config).
            # (a Gluon tile has no per-token form: its per-token config is the table's)
            twin = explicit and not config.warp_specialize
            per_token = resolve(per_token_twin(config, arch) if twin else None, per_token=True)
    module = load_module(arch, "prefill", scale_mode, fold_scales)
    # The tiles' module: the Gluon warp-specialized tile when the config asks for it.
    tiles = load_module(arch, "prefill_ws", scale_mode) if config.warp_specialize else module
    roles = call_plans.views(tensors)
    q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, cu_seqlens_q, seq_lens, prefix_lens = roles
    recorded = []
    rest = (seq_lens, prefix_lens, max_query_len, num_kv_heads, sm_scale, output, k_scale, v_scale)
    # Every launch under PDL: each waits for the one before, so `auto`'s decision, the tiles and the per-token
    # walk (emptied or not) start while the launch before them drains.
    use_pdl = _use_pdl(q)
    if per_token is None:
        tiles.launch(q, kv_cache, topk_idx, block_table, cu_seqlens_q, *rest, config, use_pdl=use_pdl, record=recorded)
    else:
        # One launch decides on the device and writes both launches' offsets (the other path's are
        # zeros); its counters are the plan's own (codegen.workspace.call_counters).
        counters = call_counters(q.device, 3, capturing, key="selection")
        # (A call whose tiles leave SMs idle keeps them only at a smaller inflation: selection.fill_factor.)
        judged_t, keep_below = tile_selection.auto_threshold(
            config.block_t, scale_mode, gluon=bool(config.warp_specialize), total_q=q.shape[0],
            num_kv_heads=num_kv_heads, sm_count=_sm_count(q.device))
        if config.warp_specialize:  # the Gluon tile's plan launch decides, exactly over every tile's plan
            decide = selection_kernel.PlanDecision.for_call(cu_seqlens_q, keep_below, counters)
            tiles.launch(q, kv_cache, topk_idx, block_table, cu_seqlens_q, *rest, config, use_pdl=use_pdl, record=recorded,
                         decide=decide)
            per_token_cu = decide.per_token_cu
        else:  # a decision launch, then the tiles
            tiled_cu, per_token_cu = selection_kernel.decide_and_split(
                topk_idx, judged_t, keep_below, cu_seqlens_q, prefix_lens, tile_selection.SAMPLED_TILES,
                counters=counters, use_pdl=use_pdl, record=recorded)
            tiles.launch(q, kv_cache, topk_idx, block_table, tiled_cu, *rest, config, use_pdl=use_pdl, record=recorded)
        module.launch(q, kv_cache, topk_idx, block_table, per_token_cu, *rest, per_token, use_pdl=use_pdl, record=recorded)
    launches = bind_recorded(recorded, roles, device=_launch_device(q))
    return call_plans.CallPlan(launches, stamp=stamp, config=config)


def sparse_attn_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
                       decode_query_len, k_scale=None, v_scale=None, query_start_loc=None, token_to_req_indices=None,
                       *, arch=None, config=None, fold_scales=True):
    """Block-sparse GQA decode (split-K, merged by a second launch or inside the split kernel);
    writes and returns `output`. CUDA-graph safe: the grid, split count and buffers depend only on
    shapes, the fused merge's counters return to zero after every call, padded rows come out as zeros.
    fold_scales=False runs the seed's unfolded scalar-scale baseline (for benchmarks)."""
    if value_checks.values_checked():  # opt-in (MSA_TUNE_CHECK_VALUES=1): every call, a device sync
        value_checks.check_decode_call(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
                                       decode_query_len, k_scale, v_scale, query_start_loc, token_to_req_indices,
                                       arch=arch)
    tensors = (q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, seq_lens, query_start_loc,
               token_to_req_indices)
    key, cacheable, stream, pointers = call_plans.call_key("decode", tensors, (num_kv_heads, sm_scale, decode_query_len),
                                                           (arch, config, fold_scales))
    plan = call_plans.PLANS.get(key) if cacheable else None
    if plan is not None:
        plan.run(tensors, pointers, stream)
        return output
    plan = _plan_decode(tensors, num_kv_heads, sm_scale, decode_query_len, arch=arch, config=config,
                        fold_scales=fold_scales, capturing=not cacheable)
    if cacheable:
        call_plans.PLANS.put(key, plan)
    return output


def _plan_decode(tensors, num_kv_heads, sm_scale, decode_query_len, *, arch, config, fold_scales,
                 capturing=False):
    """Validates a decode call, resolves its config, records and binds its launches, runs them once."""
    q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, seq_lens, query_start_loc, token_to_req = tensors
    validate.check_decode_metadata(q, seq_lens, decode_query_len, query_start_loc, token_to_req, block_table)
    arch, scale_mode = validate.check_common(arch, q, kv_cache, topk_idx, num_kv_heads, sm_scale, output,
                                             k_scale, v_scale)
    _check_fold(fold_scales, scale_mode)
    stamp = TableStamp(arch, device_name(q.device)) if config is None else None
    config = _resolve_config(config, kernel="decode", arch=arch, scale_mode=scale_mode, q=q, kv_cache=kv_cache,
                             num_kv_heads=num_kv_heads, topk=topk_idx.shape[2])
    use_pdl = _use_pdl(q)
    roles = call_plans.views(tensors)
    q, kv_cache, topk_idx, output, k_scale, v_scale, block_table, seq_lens, query_start_loc, token_to_req = roles
    recorded = []
    counters = None
    if config.fuses_merge:  # zero between calls: the last split program of a row resets its counter
        counters = call_counters(q.device, q.shape[0] * num_kv_heads, capturing)
    partials = load_module(arch, "decode_split", scale_mode, fold_scales).launch(
        q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output, decode_query_len,
        k_scale, v_scale, query_start_loc, token_to_req, config, use_pdl, counters, record=recorded)
    if partials is not None:
        part_o, part_lse = partials
        load_module(arch, "decode_merge", scale_mode, fold_scales).launch(
            part_o, part_lse, output, num_kv_heads, v_scale, config, use_pdl, record=recorded)
    launches = bind_recorded(recorded, roles, device=_launch_device(q))
    return call_plans.CallPlan(launches, stamp=stamp, config=config)


@functools.cache
def _device_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int | None:
    """The GPU's SM (CU) count; None off a GPU (the interpreter has none)."""
    if device.type != "cuda":
        return None
    return _device_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _launch_device(q: torch.Tensor) -> int:
    """The device Triton launches on: the current one (as JITFunction.run), -1 on the CPU."""
    return torch.cuda.current_device() if q.is_cuda else -1


def plan_prefill(block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len, num_kv_heads, sm_scale, *,
                 arch=None, config=None, fold_scales=True, selection=None, max_seq_len=None) -> call_plans.StepPlan:
    """One step's prefill, planned once: `.run(q, kv_cache, topk_idx, output, k_scale=None,
    v_scale=None)` per layer is sparse_attn_prefill with this step's metadata and options, at a
    lower host cost (codegen.plan.StepPlan)."""
    def drop_in(layer):
        q, kv_cache, topk_idx, output, k_scale, v_scale = layer
        sparse_attn_prefill(q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
                            num_kv_heads, sm_scale, output, k_scale, v_scale, arch=arch, config=config,
                            fold_scales=fold_scales, selection=selection, max_seq_len=max_seq_len)
    return call_plans.StepPlan("prefill", (block_table, cu_seqlens_q, seq_lens, prefix_lens),
                               (max_query_len, num_kv_heads, sm_scale),
                               (arch, config, fold_scales, selection, max_seq_len), drop_in)


def plan_decode(block_table, seq_lens, num_kv_heads, sm_scale, decode_query_len, query_start_loc=None,
                token_to_req_indices=None, *, arch=None, config=None, fold_scales=True) -> call_plans.StepPlan:
    """One step's decode, planned once: `.run(q, kv_cache, topk_idx, output, k_scale=None,
    v_scale=None)` per layer is sparse_attn_decode with this step's metadata and options, at a
    lower host cost (codegen.plan.StepPlan)."""
    def drop_in(layer):
        q, kv_cache, topk_idx, output, k_scale, v_scale = layer
        sparse_attn_decode(q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
                           decode_query_len, k_scale, v_scale, query_start_loc, token_to_req_indices, arch=arch,
                           config=config, fold_scales=fold_scales)
    return call_plans.StepPlan("decode", (block_table, seq_lens, query_start_loc, token_to_req_indices),
                               (num_kv_heads, sm_scale, decode_query_len), (arch, config, fold_scales), drop_in)
