"""The static gate on the warp-specialized Gluon prefill tile (prefill_ws, sm90): a warp_specialize
config compiles that module (from a GluonASTSource), at the design convert_rows before any table has
one, and its figures are the tile's design. (Its specialization against the JIT's binder:
test_static_gates.test_specialization_matches_the_jit.)"""
import json
import re

import pytest
import triton
import triton.language as tl

from codegen import static
from codegen.configs import LaunchConfig, ws_config
from codegen.static_cli import main as cli_main

EXCEPTIONS = static.load_exceptions()
WS_DESIGN = [launch for launch in static.shipped_launches()
             if launch.kernel == "prefill_ws" and launch.source == "design"]


def test_design_launches_cover_both_modes_and_gqas():
    # (scale mode, block_t, convert_rows) -> the layouts compiled: GQA 16 (TP1 64/4, TP4 16/1; merged where
    # they compile alike) and GQA 8 (TP8 8/1), at the convert_rows that compile without spills.
    covered = {}
    for launch in WS_DESIGN:
        key = (launch.scale_mode, launch.config.block_t, launch.config.convert_rows)
        covered.setdefault(key, set()).update((launch.heads, *launch.also_heads))
    gqa16, gqa8 = {"64/4", "16/1"}, {"8/1"}
    assert covered == {("scalar", 8, 16): gqa16, ("scalar", 8, 32): gqa16, ("scalar", 16, 16): gqa8,
                       ("scalar", 16, 32): gqa8, ("per_token_head", 8, 16): gqa16, ("per_token_head", 16, 16): gqa8}


@pytest.mark.parametrize("launch", WS_DESIGN, ids=[launch.id for launch in WS_DESIGN])
def test_ws_tile_compiles_as_designed(launch):
    """No spills within sm90's shared memory (two fp8 and two fp16 K/V stages plus q: 224 KB of 227), the
    consumer's 24 wgmma (8 k-steps of 16 each: QK and the step before's PV in the loop, the last PV after
    it), the setmaxnreg pair that moves registers from the converter warps to the MMA warps, and Triton's
    own barrier ids below the tile's named barriers (a shared id would deadlock)."""
    report = static.report_launch(launch)
    assert report.ok and report.spill == 0, report.summary()
    assert report.mma == "wgmma" and 200 * 1024 < report.shared_bytes <= static.LIMITS["sm90"].shared_bytes
    ptx = static.compile_asm(launch)
    assert ptx.count("wgmma.mma_async") == 24
    triton_ids = {int(i) for i in re.findall(r"\b(?:bar|barrier)\.(?:sync|arrive)(?:\.aligned)?\s+(\d+)", ptx)}
    assert triton_ids and max(triton_ids) < min(launch.module().NAMED_BARRIERS), triton_ids
    assert re.search(r"setmaxnreg\.dec\.sync", ptx) and re.search(r"setmaxnreg\.inc\.sync", ptx)


def test_a_spilling_ws_config_is_a_violation(capsys):
    """convert_rows 64 (scalar) spills with Triton 3.6 (170 B): the tuner's check, the gate's table and
    the command line all report it."""
    config = ws_config(gqa=16, convert_rows=64)
    [report] = static.check_launch("sm90", "prefill", "scalar", "fp8", 64, 4, config)
    assert report.variant == "sm90_prefill_ws_scalar" and report.spill > 0, report.summary()
    assert any(problem.startswith("register spills") for problem in report.problems)
    [row] = static.report_rows([report], EXCEPTIONS)
    assert row["status"] == "FAIL" and "ws bt8 cr64" in static.table_text([row])
    code = cli_main(["compile", "--arch", "sm90", "--kernel", "prefill_ws", "--scale-mode", "scalar", "--kv-dtype",
                     "fp8", "--heads", "64/4", "--config", '{"convert_rows": 64}', "--json"])
    [out] = json.loads(capsys.readouterr().out)
    assert code == 1 and out["variant"] == "sm90_prefill_ws_scalar" and out["config"] == config.to_dict()


def test_warp_specialize_configs_compile_the_ws_module(tmp_path):
    """A warp_specialize config runs the Gluon tile (codegen.api), so the gate compiles prefill_ws for it,
    a tuned table's too; compiled as another module, or the ws module without one, it is invalid."""
    config = ws_config(gqa=16, convert_rows=16)
    [launch] = static.launches_for("sm90", "prefill", "per_token_head", "fp8", 64, 4, config)
    assert (launch.kernel, launch.family, launch.variant) == ("prefill_ws", "prefill", "sm90_prefill_ws_per_token_head")
    entry = {"config": ws_config(gqa=8).to_dict()}
    table = {"arch": "sm90", "tables": {"prefill/scalar/fp8/8x1": {"buckets": {"4096": entry}}}}
    (tmp_path / "sm90__NVIDIA_H200.json").write_text(json.dumps(table))
    assert [launch.variant for launch in static.tuned_launches(tmp_path)] == ["sm90_prefill_ws_scalar"]
    invalid = {
        "kernel 'prefill_ws'": static.StaticLaunch("sm90", "prefill", "scalar", "fp8", 64, 4, config),
        "takes warp_specialize=1": static.StaticLaunch("sm90", "prefill_ws", "scalar", "fp8", 64, 4,
                                                       LaunchConfig(block_t=8)),
        "there is none": static.launches_for("sm90", "prefill", "none", "fp8", 64, 4, config)[0],
        "fp8 e4m3fn cache": static.StaticLaunch("sm90", "prefill_ws", "scalar", "bf16", 64, 4, config),
        "GQA 8 or 16": static.StaticLaunch("sm90", "prefill_ws", "scalar", "fp8", 32, 1, ws_config(gqa=16)),
    }
    for message, launch in invalid.items():
        with pytest.raises(ValueError, match=message):
            static.compile_inputs(launch)
    rows = static.report_rows(static.report_many(list(invalid.values()), jobs=1), EXCEPTIONS)
    assert [row["status"] for row in rows] == ["FAIL"] * len(invalid)


@triton.jit(do_not_specialize=["stride_q_d"], do_not_specialize_on_alignment=["out_ptr"])
def _unspecialized(q_ptr, out_ptr, stride_q_d, stride_o_d, stride_q_t, BLOCK: tl.constexpr):
    pass


def test_do_not_specialize_arguments_compile_as_the_jit_binds_them():
    """An argument a kernel lists in do_not_specialize is a plain i32 even at value 1 (the JIT's binder
    passes specialize=False), one in do_not_specialize_on_alignment gets no divisibility; the others are
    specialized on their typical values (unit stride_o_d a constant, stride_q_t divisible by 16)."""
    from codegen.static.compile import _signature

    launch = static.StaticLaunch("sm90", "prefill_ws", "scalar", "fp8", 64, 4, ws_config(gqa=16, convert_rows=16))
    signature, constexprs, attrs, notes = _signature(launch, _unspecialized, {"BLOCK": 16})
    assert signature == {"q_ptr": "*bf16", "out_ptr": "*bf16", "stride_q_d": "i32", "stride_o_d": "constexpr",
                         "stride_q_t": "i32", "BLOCK": "constexpr"}
    assert constexprs == {"BLOCK": 16, "stride_o_d": 1} and not notes
    divisible = {_unspecialized.arg_names[path[0]] for path, values in attrs.items()
                 if ["tt.divisibility", 16] in values}
    assert divisible == {"q_ptr", "stride_q_t"}
