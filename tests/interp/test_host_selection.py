"""Prefill's host rule (issue 37): `auto` with the table's configs plans the per-token launch alone
when the call's shapes fall in the measured per-token region (codegen.selection.PER_TOKEN_UP_TO),
and decides on the device as before everywhere else."""
import pytest
import torch

from codegen import LaunchConfig, cases, plan, selection, tuned_store
from codegen import api as api_module
from codegen.accuracy import compare, gate_dtype
from codegen.selection import per_token_on_host
from codegen.shapes import HEAD_LAYOUTS
from codegen.variants import ARCHS, SCALE_MODES

# Small shapes (the interpreter): 8 q / 2 KV heads; two requests, the longer of 16 tokens.
SHAPE = dict(q_lens=[16, 9], prefix_lens=[8000, 300], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
             kv_dtype="fp8", scale_mode="scalar")
HQ, HKV, REQUESTS, MAX_QUERY_LEN = 8, 2, 2, 16
TILES = LaunchConfig(block_n=32, block_t=4)  # the table's tiled config: auto has something to decide
PER_TOKEN = LaunchConfig(block_n=16)  # its per-token sub-entry: told apart from the tiles' twin (block_n 32)


def _table(monkeypatch, entries):
    monkeypatch.setattr(selection, "PER_TOKEN_UP_TO", entries)


# --- the lookup ---------------------------------------------------------------------------------

def test_the_lookup_takes_the_smallest_bucket_that_holds_the_request_count(monkeypatch):
    _table(monkeypatch, {"sm90": {("scalar", 16, 1): ((4, 64), (1, 128))}})  # any order: sorted by requests
    inside = [(1, 128), (0, 128), (2, 64), (4, 64), (1, 1)]
    outside = [(1, 129), (2, 65), (4, 128), (5, 1), (16, 16)]  # past the bucket's length; more requests than any
    assert [per_token_on_host("sm90", "scalar", 16, 1, n, q) for n, q in inside] == [True] * len(inside)
    assert [per_token_on_host("sm90", "scalar", 16, 1, n, q) for n, q in outside] == [False] * len(outside)


def test_a_missing_arch_mode_or_layout_has_no_host_rule(monkeypatch):
    _table(monkeypatch, {"sm90": {("scalar", 16, 1): ((16, 512),)}})
    assert per_token_on_host("sm90", "scalar", 16, 1, 1, 16)
    assert not per_token_on_host("gfx942", "scalar", 16, 1, 1, 16)  # arch
    assert not per_token_on_host("sm90", "per_token_head", 16, 1, 1, 16)  # scale mode
    assert not per_token_on_host("sm90", "scalar", 64, 4, 1, 16)  # another layout of the same gqa
    assert not per_token_on_host("sm90", "scalar", 8, 1, 1, 16)  # another layout
    _table(monkeypatch, {"sm90": {("scalar", 16, 1): ((4, 0),)}})  # a bucket where even the shortest lost
    assert not per_token_on_host("sm90", "scalar", 16, 1, 1, 16)


@pytest.mark.parametrize("args, error, match", [
    (("sm80", "scalar", 16, 1, 1, 16), ValueError, "arch: expected one of"),
    (("sm90", "fp8", 16, 1, 1, 16), ValueError, "scale_mode: expected one of"),
    (("sm90", "scalar", 0, 1, 1, 16), ValueError, "num_q_heads: expected an int >= 1, got 0"),
    (("sm90", "scalar", 16, 0, 1, 16), ValueError, "num_kv_heads: expected an int >= 1, got 0"),
    (("sm90", "scalar", 16, 1, -1, 16), ValueError, "num_requests: expected an int >= 0, got -1"),
    (("sm90", "scalar", 16, 1, 1, -1), ValueError, "max_query_len: expected an int >= 0, got -1"),
    (("sm90", "scalar", 16.0, 1, 1, 16), TypeError, "num_q_heads: expected an int, got float"),
    (("sm90", "scalar", 16, "1", 1, 16), TypeError, "num_kv_heads: expected an int, got str"),
    (("sm90", "scalar", 16, 1, True, 16), TypeError, "num_requests: expected an int, got bool"),
    (("sm90", "scalar", 16, 1, 1, "16"), TypeError, "max_query_len: expected an int, got str"),
])
def test_bad_arguments_are_named(monkeypatch, args, error, match):
    _table(monkeypatch, {})
    with pytest.raises(error, match=match):
        per_token_on_host(*args)


def test_the_shipped_table_is_well_formed():
    """Archs and scale modes the kernels know, a head layout of codegen.shapes, buckets of distinct
    request counts >= 1 and lengths >= 0; gfx942 was never measured, so it has no entries."""
    assert "gfx942" not in selection.PER_TOKEN_UP_TO
    for arch, entries in selection.PER_TOKEN_UP_TO.items():
        assert arch in ARCHS
        for (mode, hq, hkv), buckets in entries.items():
            assert mode in SCALE_MODES and (hq, hkv) in HEAD_LAYOUTS.values(), (arch, mode, hq, hkv)
            requests = [r for r, _ in buckets]
            assert len(set(requests)) == len(requests) and min(requests) >= 1, (arch, mode, buckets)
            assert all(type(q) is int and q >= 0 for _, q in buckets), (arch, mode, buckets)


def test_the_shipped_table_keeps_tp1_and_tp4_apart():
    """The H200 run keyed by layout (results/h200/auto-cost/break_even.txt): one request of 128 tokens
    is inside TP4's (16/1) region in both fp8 modes and outside TP1's (64/4), which shares its gqa;
    TP4 per_token_head reaches 256 for one request and 16 tokens for 16."""
    for mode in ("scalar", "per_token_head"):
        assert per_token_on_host("sm90", mode, 16, 1, 1, 128), mode
        assert not per_token_on_host("sm90", mode, 64, 4, 1, 128), mode
        assert per_token_on_host("sm90", mode, 64, 4, 1, 64) and per_token_on_host("sm90", mode, 8, 1, 1, 128), mode
    assert not per_token_on_host("sm90", "scalar", 16, 1, 1, 256)
    assert per_token_on_host("sm90", "per_token_head", 16, 1, 1, 256)
    assert per_token_on_host("sm90", "per_token_head", 16, 1, 4, 64)
    assert not per_token_on_host("sm90", "scalar", 16, 1, 4, 64)
    assert per_token_on_host("sm90", "per_token_head", 16, 1, 16, 16)
    assert not per_token_on_host("sm90", "scalar", 16, 1, 16, 16) and not per_token_on_host("sm90", "per_token_head", 16, 1, 16, 32)
    assert not per_token_on_host("sm90", "scalar", 32, 2, 1, 16)  # TP2 was not measured: the device decides


# --- the API under the interpreter ----------------------------------------------------------------

@pytest.fixture
def tuned_table(tmp_path, monkeypatch):
    """A tuned file for the interpreter's device whose prefill table (8 q / 2 KV heads, scalar fp8)
    holds a tiled config (block_t 4) and a per-token sub-entry: config=None then means both."""
    from codegen.loader import current_inputs_sha256

    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(tmp_path))
    doc = tuned_store.new_document("sm90", "cpu-interpreter")
    provenance = {key: None for key in tuned_store._PROVENANCE_KEYS}
    provenance.update(measured=True, arch="sm90", inputs_sha256=current_inputs_sha256("sm90", "prefill", "scalar"))
    entry = dict(is_default=False, default_us=10.0, tuned_us=8.0, trials=5, failures=0)
    doc["tables"][tuned_store.table_key("prefill", "scalar", "fp8", 8, 2)] = {
        "provenance": provenance,
        "buckets": {"32": dict(entry, config=TILES.to_dict(), per_token=dict(entry, config=PER_TOKEN.to_dict()))},
    }
    tuned_store.write_document(tmp_path / tuned_store.file_name("sm90", "cpu-interpreter"), doc)


@pytest.fixture
def launched(monkeypatch):
    """What the plans launch, in order: "decide" for the decision launch, else the config of each
    prefill launch (its last positional argument)."""
    from codegen import selection_kernel

    seen = []
    real_decide = selection_kernel.decide_and_split
    monkeypatch.setattr(selection_kernel, "decide_and_split", lambda *a, **k: seen.append("decide") or real_decide(*a, **k))
    real_load = api_module.load_module

    class Spy:
        def __init__(self, module):
            self.module = module

        def launch(self, *args, **kwargs):
            seen.append(args[-1])
            return self.module.launch(*args, **kwargs)

    monkeypatch.setattr(api_module, "load_module", lambda *a: Spy(real_load(*a)))
    return seen


def _checked(case, **kw):
    case.poison()
    out = cases.run_kernel(case, arch="sm90", **kw)
    result = compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, kw.get("config")))
    assert result.ok, result


def _only_plan() -> plan.CallPlan:
    (kept,) = plan.PLANS._plans.values()
    return kept


DEVICE_DECIDES = ["decide", TILES, PER_TOKEN]  # today's auto: the decision, the tiles, the per-token launch


@pytest.mark.parametrize("selection_arg", [None, "auto"])  # the default, and auto named
def test_inside_the_region_auto_plans_the_per_token_launch_alone(tuned_table, launched, monkeypatch,
                                                                 selection_arg):
    _table(monkeypatch, {"sm90": {("scalar", HQ, HKV): ((REQUESTS, MAX_QUERY_LEN),)}})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=1, future_prob=0.0, **SHAPE)
    assert case.args["max_query_len"] == MAX_QUERY_LEN and case.args["cu_seqlens_q"].shape[0] - 1 == REQUESTS
    _checked(case, selection=selection_arg)
    assert launched == [PER_TOKEN]  # one launch, the table's per-token config; no decision, no tiles
    kept = _only_plan()
    assert len(kept.launches) == 1 and kept.config == PER_TOKEN and kept.stamp is not None
    launched.clear()
    _checked(case, selection=selection_arg)  # the plan serves the next call: nothing recorded again
    assert launched == [] and len(plan.PLANS) == 1


def test_inside_the_region_auto_runs_what_per_token_runs(tuned_table, launched, monkeypatch):
    _table(monkeypatch, {"sm90": {("scalar", HQ, HKV): ((REQUESTS, MAX_QUERY_LEN),)}})
    case = cases.prefill_case(arch="sm90", pattern="random", seed=2, future_prob=0.0, **SHAPE)
    _checked(case, selection="per_token")
    named = _only_plan()
    plan.PLANS.clear()
    _checked(case)
    auto = _only_plan()
    assert launched == [PER_TOKEN, PER_TOKEN] and auto.config == named.config
    assert [launch.grid for launch in auto.launches] == [launch.grid for launch in named.launches]


@pytest.mark.parametrize("entries", [
    {},  # nothing measured
    {"sm90": {("scalar", HQ, HKV): ((REQUESTS, MAX_QUERY_LEN - 1),)}},  # the longest request is one token too long
    {"sm90": {("scalar", HQ, HKV): ((REQUESTS - 1, 512),)}},  # more requests than the largest bucket
    {"sm90": {("per_token_head", HQ, HKV): ((16, 512),), ("scalar", 2 * HQ, HKV): ((16, 512),),
              ("scalar", 4 * HQ, 4 * HKV): ((16, 512),)}},  # other mode; other layouts, one of the same gqa
    {"gfx942": {("scalar", HQ, HKV): ((16, 512),)}},  # another arch's
])
def test_outside_the_region_the_device_decides_as_before(tuned_table, launched, monkeypatch, entries):
    _table(monkeypatch, entries)
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=3, future_prob=0.0, **SHAPE)
    _checked(case)
    assert launched == DEVICE_DECIDES
    kept = _only_plan()
    assert len(kept.launches) == 3 and kept.config == TILES


def test_a_given_config_keeps_its_selection(tuned_table, launched, monkeypatch):
    """A config passed with selection='auto' still decides on the device (with its per-token twin);
    without a selection it runs as given (tiled); the host rule is for the table's configs only."""
    _table(monkeypatch, {"sm90": {("scalar", HQ, HKV): ((16, 512),)}})
    case = cases.prefill_case(arch="sm90", pattern="random", seed=4, future_prob=0.0, **SHAPE)
    given = LaunchConfig(block_n=64, block_t=2)
    _checked(case, config=given, selection="auto")
    assert launched == ["decide", given, LaunchConfig(block_n=64)]
    launched.clear()
    _checked(case, config=given)
    assert launched == [given]
    launched.clear()
    _checked(case, selection="tiled")  # named tiles with the table's config: tiles, no host rule
    assert launched == [TILES]


def test_a_step_plan_takes_the_same_rule(tuned_table, launched, monkeypatch):
    _table(monkeypatch, {"sm90": {("scalar", HQ, HKV): ((REQUESTS, MAX_QUERY_LEN),)}})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=5, future_prob=0.0, **SHAPE)
    a = case.args
    step = api_module.plan_prefill(a["block_table"], a["cu_seqlens_q"], a["seq_lens"], a["prefix_lens"],
                                   a["max_query_len"], a["num_kv_heads"], a["sm_scale"], arch="sm90")
    want = cases.run_reference(case)
    for _ in range(2):
        case.poison()
        out = step.run(a["q"], a["kv_cache"], a["topk_idx"], a["output"], a["k_scale"], a["v_scale"])
        assert compare(out, want, gate_dtype(a["q"].dtype, None)).ok
    assert launched == [PER_TOKEN] and len(_only_plan().launches) == 1
    assert out is a["output"]  # written in place and returned, as vLLM expects


# --- the caller's bound on the sequences (max_seq_len) ---------------------------------------------

# Short sequences: at most 309 tokens, under topk (4) x 128 = 512, so every token reads all its blocks.
SHORT = dict(SHAPE, prefix_lens=[100, 300])
SHORT_MAX_SEQ = 309


def test_tiles_on_host_is_the_topk_pages_bound():
    assert selection.tiles_on_host(2048, 16) and selection.tiles_on_host(1, 16)
    assert not selection.tiles_on_host(2049, 16) and not selection.tiles_on_host(None, 16)
    assert selection.tiles_on_host(512, 4) and not selection.tiles_on_host(513, 4)
    with pytest.raises(ValueError, match="topk: expected an int >= 1, got 0"):
        selection.tiles_on_host(100, 0)


@pytest.mark.parametrize("config", [None, TILES])  # the table's configs, and a given one under "auto"
def test_under_a_short_bound_auto_plans_the_tiles_alone(tuned_table, launched, monkeypatch, config):
    _table(monkeypatch, {})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=4, future_prob=0.0, **SHORT)
    assert int(case.args["seq_lens"].max()) == SHORT_MAX_SEQ
    _checked(case, selection="auto", config=config, max_seq_len=SHORT_MAX_SEQ)
    assert launched == [TILES]  # no decision launch, no emptied per-token launch
    assert len(_only_plan().launches) == 1


def test_a_bound_past_topk_pages_or_none_leaves_the_decision_to_the_device(tuned_table, launched, monkeypatch):
    _table(monkeypatch, {})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=5, future_prob=0.0, **SHORT)
    for bound in (None, 4 * 128 + 1):
        plan.PLANS.clear()
        launched.clear()
        _checked(case, max_seq_len=bound)
        assert launched == DEVICE_DECIDES, bound


def test_the_per_token_region_comes_before_the_bound(tuned_table, launched, monkeypatch):
    _table(monkeypatch, {"sm90": {("scalar", HQ, HKV): ((REQUESTS, MAX_QUERY_LEN),)}})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=6, future_prob=0.0, **SHORT)
    _checked(case, max_seq_len=SHORT_MAX_SEQ)
    assert launched == [PER_TOKEN]


def test_the_bound_is_part_of_the_plans_key(tuned_table, launched, monkeypatch):
    _table(monkeypatch, {})
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=7, future_prob=0.0, **SHORT)
    _checked(case, max_seq_len=SHORT_MAX_SEQ)
    _checked(case)  # no bound: its own plan, the device's decision
    assert launched == [TILES] + DEVICE_DECIDES and len(plan.PLANS) == 2


@pytest.mark.parametrize("bound, error, match", [
    (MAX_QUERY_LEN - 1, ValueError, rf"max_seq_len: expected None or an int >= max_query_len \({MAX_QUERY_LEN}\), got 15"),
    (0, ValueError, "max_seq_len: expected an int >= 1, got 0"),
    (True, TypeError, "max_seq_len: expected an int, got bool"),
    (309.0, TypeError, "max_seq_len: expected an int, got float"),
])
def test_a_bad_bound_is_named(tuned_table, bound, error, match):
    case = cases.prefill_case(arch="sm90", pattern="correlated", seed=8, future_prob=0.0, **SHORT)
    with pytest.raises(error, match=match):
        cases.run_kernel(case, arch="sm90", max_seq_len=bound)
