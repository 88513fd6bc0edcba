"""msa-tune: generated Triton kernels for MiniMax-M3 block-sparse attention (MSA), their tuned
launch configs, and a float64 reference.

Public API: sparse_attn_prefill, sparse_attn_decode, reference_prefill, reference_decode,
get_config, LaunchConfig.
"""
from .api import sparse_attn_decode, sparse_attn_prefill
from .configs import LaunchConfig
from .loader import ConfigChoice, get_config
from .reference import reference_decode, reference_prefill

__all__ = [
    "ConfigChoice",
    "LaunchConfig",
    "get_config",
    "reference_decode",
    "reference_prefill",
    "sparse_attn_decode",
    "sparse_attn_prefill",
]
