"""Multi-token decode (speculative verify: every request brings decode_query_len > 1 tokens) runs the
configs its token-count bucket tuned on single-token requests. Triton compiles decode_query_len == 1 as
a constant and every other value as one generic kernel, so ptxas allocates the two differently.
On 2026-12-07 the generic compile of TP8 per_token_head `bn128 w8 st1 sp8 up0` (plain loads) took 172
registers against 128: one program an SM instead of two, x0.66 on 8 requests x 4 tokens (H100; x0.65 on the H200).
This gate compiles every shipped sm90 decode config both ways and fails where the multi-token kernel
fits fewer programs on an SM by its registers."""
from __future__ import annotations

import dataclasses

import pytest

from codegen import static

REGISTERS_PER_SM = 65536  # sm90
WARP_ALLOCATION = 256  # registers are allocated per warp in units of 256


def programs_per_sm(registers: int, num_warps: int) -> int:
    """How many programs of `num_warps` warps fit an SM's register file at `registers` a thread."""
    per_warp = -(-registers * 32 // WARP_ALLOCATION) * WARP_ALLOCATION
    return REGISTERS_PER_SM // per_warp // num_warps


# Every shipped sm90 split-kernel compile (defaults, design options, tuned tables; one per distinct
# compile), in its uniform form: varlen launches pass decode_query_len 1 whatever their lengths.
LAUNCHES = [launch for launch in static.shipped_launches()
            if launch.arch == "sm90" and launch.kernel == "decode_split" and not launch.varlen]


def test_programs_per_sm_counts_whole_warps():
    assert programs_per_sm(128, 8) == 2
    assert programs_per_sm(172, 8) == 1
    assert programs_per_sm(255, 1) == 8
    assert programs_per_sm(125, 2) == 8  # 125 rounds up to 128 a thread


def test_the_tables_have_decode_launches():
    assert sum(launch.source.startswith("tuned:") for launch in LAUNCHES) >= 10, [launch.id for launch in LAUNCHES]


@pytest.mark.parametrize("launch", LAUNCHES, ids=[launch.id for launch in LAUNCHES])
def test_four_token_launch_fits_as_many_programs_per_sm(launch):
    one = static.report_launch(launch)
    four = static.report_launch(dataclasses.replace(launch, decode_query_len=4))
    assert one.registers and four.registers, (one.summary(), four.summary())
    warps = launch.config.num_warps
    assert programs_per_sm(four.registers, warps) >= programs_per_sm(one.registers, warps), (
        f"{launch.id}: {four.registers} registers with 4-token requests against {one.registers} with one "
        f"({programs_per_sm(four.registers, warps)} programs an SM against {programs_per_sm(one.registers, warps)})")
