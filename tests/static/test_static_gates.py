"""Static resource gates: every shipped kernel and config compiled ahead of time for sm90 and gfx942.

Run in its own process (no TRITON_INTERPRET): python -m pytest -q -n 2 tests/static
A failing gate names the launch (variant, KV dtype, heads, config) and every figure.
"""
import json
import warnings

import pytest

from codegen import static
from codegen.configs import LaunchConfig
from codegen.static_cli import main as cli_main
from codegen.variants import all_variants

EXCEPTIONS = static.load_exceptions()
SHIPPED = static.shipped_launches()


def _ids(launches):
    seen: dict[str, int] = {}
    ids = []
    for launch in launches:
        seen[launch.id] = seen.get(launch.id, 0) + 1
        ids.append(launch.id if seen[launch.id] == 1 else f"{launch.id}#{seen[launch.id]}")
    return ids


def test_shipped_set_covers_every_module():
    covered = {(launch.arch, launch.kernel, launch.scale_mode) for launch in SHIPPED}
    missing = [v.name for v in all_variants() if (v.arch, v.kernel, v.scale_mode) not in covered]
    assert not missing, f"generated modules without a shipped launch to gate: {missing}"
    splits = {launch.config.num_splits > 1 for launch in SHIPPED if launch.kernel == "decode_split"}
    assert splits == {True, False}, "decode must be gated with one split and with several"


@pytest.mark.parametrize("launch", SHIPPED, ids=_ids(SHIPPED))
def test_shipped_launch_fits(launch):
    report = static.report_launch(launch)
    unexcused, _ = static.split_problems(report, EXCEPTIONS)
    assert not unexcused, f"{report.summary()}\n(allowed exceptions live in static_exceptions.json, with a reason)"


def test_exceptions_file_is_valid():
    for entry in EXCEPTIONS:  # load_exceptions already rejects unknown keys and missing reasons
        assert entry["reason"].strip()


# A [BLOCK_M, HEAD_DIM] bf16 tile with BLOCK_M = 1024 query-head rows is 256 KB of shared memory on its
# own: more than the 227 KB an sm90 block may have. 512 rows (128 KB) overflow the 64 KB LDS of gfx942.
# (Wide GQA keeps these compiles at 1-4 s; prefill block_t=16 with 64/4 heads reaches 96 KB on sm90.)
OVERFLOWS = [
    ("sm90", 1024, LaunchConfig(block_n=16, num_warps=16, num_stages=1)),
    ("gfx942", 512, LaunchConfig(block_n=16, num_warps=16, num_stages=1)),
]


@pytest.mark.parametrize("arch,num_q_heads,config", OVERFLOWS, ids=[a for a, _, _ in OVERFLOWS])
def test_shared_memory_overflow_is_rejected_with_figures(arch, num_q_heads, config):
    reports = static.check_launch(arch, "decode", "scalar", "fp8", num_q_heads, 1, config)
    report = reports[0]
    limit = static.LIMITS[arch].shared_bytes
    assert report.shared_bytes is not None and report.shared_bytes > limit, report.summary()
    assert not report.ok
    overflow = [p for p in report.problems if static.LIMITS[arch].shared_name in p]
    assert overflow, report.summary()
    assert str(report.shared_bytes) in overflow[0] and str(limit) in overflow[0], overflow[0]


def test_misspelled_option_is_an_error():
    with pytest.raises(ValueError, match=r"wavs_per_eu.*waves_per_eu"):
        static.validate_options("gfx942", {"num_warps": 4, "wavs_per_eu": 2})
    with pytest.raises(ValueError, match="waves_per_eu"):  # an AMD knob means nothing to the cuda backend
        static.validate_options("sm90", {"waves_per_eu": 2})
    assert static.validate_options("gfx942", {"waves_per_eu": 2, "kpack": 2}) == {"waves_per_eu": 2, "kpack": 2}
    with pytest.raises(ValueError, match="wavs_per_eu"):  # as an extra compile option
        static.compile_report("gfx942", "prefill", "scalar", "fp8", 64, 4, LaunchConfig(), options={"wavs_per_eu": 2})
    with pytest.raises(ValueError, match="wavs_per_eu"):  # as a config field
        static.compile_report("gfx942", "prefill", "scalar", "fp8", 64, 4, {"wavs_per_eu": 2})


def test_cli_rejects_misspelled_option(capsys):
    code = cli_main(["compile", "--arch", "gfx942", "--kernel", "prefill", "--scale-mode", "scalar",
                     "--kv-dtype", "fp8", "--heads", "64/4", "--options", '{"wavs_per_eu": 2}'])
    assert code == 2
    assert "wavs_per_eu" in capsys.readouterr().err


def test_cache_is_hit_on_second_call(tmp_path, monkeypatch):
    monkeypatch.setenv(static.CACHE_ENV, str(tmp_path))
    config = LaunchConfig(num_splits=4)
    first = static.compile_report("sm90", "decode_merge", "scalar", "fp8", 8, 1, config)
    second = static.compile_report("sm90", "decode_merge", "scalar", "fp8", 8, 1, config)
    assert not first.cached and second.cached
    assert (first.registers, first.spill, first.shared_bytes) == (second.registers, second.spill, second.shared_bytes)
    assert len(list(tmp_path.glob("*.json"))) == 1
    other = static.compile_report("sm90", "decode_merge", "scalar", "fp8", 8, 1, LaunchConfig(num_splits=8))
    assert not other.cached  # another config is another key


def test_cli_compile_prints_one_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(static.CACHE_ENV, str(tmp_path))
    code = cli_main(["compile", "--arch", "sm90", "--kernel", "decode_merge", "--scale-mode", "none",
                     "--kv-dtype", "bf16", "--heads", "16/1", "--config", '{"num_splits": 2}', "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out) == 1
    assert out[0]["variant"] == "sm90_decode_merge_none" and out[0]["ok"] and out[0]["use_pdl"]


def test_launch_mimics_a_real_jit_specialization():
    launch = static.StaticLaunch("gfx942", "decode_split", "per_token_head", "fp8", 64, 4, LaunchConfig(num_splits=16))
    inputs = static.compile_inputs(launch)
    assert inputs.signature["kv_ptr"] == "*fp8e4b8" and inputs.signature["q_ptr"] == "*bf16"
    # unit strides and one-page splits become constants, as the JIT does with int arguments equal to 1
    for name in ("stride_q_d", "stride_kv_d", "stride_tk_k", "decode_query_len", "blocks_per_split"):
        assert inputs.signature[name] == "constexpr" and inputs.constexprs[name] == 1, name
    q_index = (0,)
    assert ["tt.divisibility", 16] in inputs.attrs[q_index]


def test_tuned_configs_are_read_defensively(tmp_path):
    tables = {"arch": "sm90", "tables": {"prefill/scalar/fp8/64x4": {"buckets": {"16": {"config": {"block_n": 32}}}},
                                         "decode/none/bf16/8x1": {"buckets": {"1": {"config": {"num_splits": 4}}}}}}
    (tmp_path / "sm90__NVIDIA_H200.json").write_text(json.dumps(tables))
    flat = [{"arch": "gfx942", "kernel": "prefill", "scale_mode": "none", "kv_dtype": "fp8", "num_q_heads": 16,
             "num_kv_heads": 1, "config": {"block_n": 32, "waves_per_eu": 2}},
            {"arch": "gfx942", "config": {"block_n": 32}}]  # no kernel/heads: skipped with a warning
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launches = static.tuned_launches(tmp_path)
    got = sorted((launch.arch, launch.kernel, launch.heads, launch.config.block_n, launch.config.num_splits)
                 for launch in launches)
    assert got == [("gfx942", "prefill", "16/1", 32, 1), ("sm90", "decode_merge", "8/1", 64, 4),
                   ("sm90", "decode_split", "8/1", 64, 4), ("sm90", "prefill", "64/4", 32, 1)]
    assert any("skipped" in str(w.message) for w in caught)
