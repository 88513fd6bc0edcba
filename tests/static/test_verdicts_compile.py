"""`auto` on the Triton tiles (templates/prefill.py.jinja, VERDICTS) compiled ahead of time for both
archs: the tiles that write their verdicts and return early, the per-token walk that reads them and
skips its token, each from the shipped kind of config. The interpreter runs the same branches
(tests/interp/test_selection.py); this checks that they compile and that the verdict traffic is there."""
import re

import pytest

from codegen import static
from codegen.configs import LaunchConfig

CONFIGS = {1: LaunchConfig(block_n=64, block_t=4, num_warps=4, num_stages=2, kv_upcast=2),
           2: LaunchConfig(block_n=128, block_t=1, num_warps=4, num_stages=2, kv_upcast=2)}


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
@pytest.mark.parametrize("verdicts", [0, 1, 2])
def test_verdict_sides_compile(arch, verdicts):
    config = CONFIGS[verdicts or 1]
    launch = static.StaticLaunch(arch, "prefill", "scalar", "fp8", 16, 1, config, verdicts=verdicts)
    asm = static.compile_asm(launch, "ttgir")  # a compile error raises here, with Triton's message
    # The verdicts are the only int8 traffic of the kernel: stored by the tiles, loaded by the walk.
    stores = re.findall(r"tt\.store %\S+, %\S+(?:, %\S+)? : tensor<[^>]*xi8|tt\.store %\S+, %\S+ : !tt\.ptr<i8>", asm)
    loads = re.findall(r"tt\.load %\S+ : !tt\.ptr<i8>", asm)
    assert (bool(stores), bool(loads)) == {0: (False, False), 1: (True, False), 2: (False, True)}[verdicts]


def test_a_verdict_side_must_match_the_config():
    with pytest.raises(ValueError, match="verdicts"):
        static.StaticLaunch("sm90", "prefill", "scalar", "fp8", 16, 1, CONFIGS[2], verdicts=1)
    with pytest.raises(ValueError, match="verdicts"):
        static.StaticLaunch("sm90", "decode_split", "scalar", "fp8", 16, 1, LaunchConfig(), verdicts=2)
