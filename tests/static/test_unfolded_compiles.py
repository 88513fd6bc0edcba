"""The unfolded scalar baseline (fold_scales=False: benchmarks/bench.py's `unfolded` column runs it
with the tuned configs) compiles for sm90 on the K/V paths the folded modules take: TMA boxes and
kv_upcast 0, 2 and 3, in decode and in both prefill walks.

The shipped gate compiles the unfolded modules at the arch defaults only, and the interpreter takes
`.to()` for the V conversion's asm, so neither saw kv_upcast 3 hand the asm an already scaled
16-bit V (a bitcast to fp8 bytes that does not compile)."""
import re

import pytest

from codegen import static
from codegen.configs import LaunchConfig

# Configs of the H200 table (tuned_configs/sm90__NVIDIA_H200.json, scalar fp8), read through TMA.
CONFIGS = {
    "decode_one_split": ("decode", 64, 4, dict(block_n=64, num_splits=1, num_warps=1, num_stages=3)),
    "decode_fused_merge": ("decode", 16, 1, dict(block_n=128, num_splits=2, fused_merge=1, num_warps=4,
                                                 num_stages=3)),
    "prefill_per_token": ("prefill", 8, 1, dict(block_n=128, block_t=1, num_warps=4, num_stages=2)),
    "prefill_tiles": ("prefill", 64, 4, dict(block_n=128, block_t=4, num_warps=4, num_stages=2)),
}
# The asm V conversion of kv_upcast 3 (_e4m3_to_fp16 or its zeroing form), as TTGIR shows it.
_V_CVT_ASM = re.compile(r"tt\.elementwise_inline_asm \"[^\"]*cvt\.rn\.f16x2\.e4m3x2")


@pytest.mark.parametrize("kv_upcast", [0, 2, 3])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_unfolded_compiles_through_tma(name, kv_upcast):
    family, hq, hkv, fields = CONFIGS[name]
    config = LaunchConfig(**fields, kv_upcast=kv_upcast, kv_tma=1)
    launch = static.launches_for("sm90", family, "scalar", "fp8", hq, hkv, config, fold_scales=False)[0]
    assert launch.variant.endswith("_unfolded")
    ttgir = static.compile_asm(launch, "ttgir")  # a compile error raises here, with Triton's message
    assert "ttng.async_tma_copy_global_to_local" in ttgir, "K/V not read through TMA"
    # kv_upcast 3 keeps its point in the baseline too: V converted by the asm, not by `.to()`.
    assert bool(_V_CVT_ASM.search(ttgir)) == (kv_upcast == 3)
