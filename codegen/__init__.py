"""msa-tune: generated Triton kernels for MiniMax-M3 block-sparse attention (MSA), their tuned
launch configs, and a float64 reference.

Public API: sparse_attn_prefill, sparse_attn_decode (vLLM's drop-ins), plan_prefill, plan_decode
(one step's calls planned once, run per layer), reference_prefill, reference_decode, get_config,
LaunchConfig.

The names are imported on first use (PEP 562), so that importing a part of the package - the
static gate, the renderer - does not import the runtime API with it.
"""
import importlib

_EXPORTS = {
    "ConfigChoice": "loader",
    "LaunchConfig": "configs",
    "get_config": "loader",
    "plan_decode": "api",
    "plan_prefill": "api",
    "reference_decode": "reference",
    "reference_prefill": "reference",
    "sparse_attn_decode": "api",
    "sparse_attn_prefill": "api",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    try:  # `codegen.api` and the like without importing them first, as when this file imported them
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
