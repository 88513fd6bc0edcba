"""Prefill's tiled / per-token decision (codegen.selection) and the API's `selection` argument."""
import pytest
import torch

from codegen import LaunchConfig, cases
from codegen.accuracy import compare, gate_dtype
from codegen.api import load_module
from codegen.selection import choose_tiles, split_seqlens, tile_inflation, tiles_pay_off_below


def _case(pattern, seed=0, **kw):
    shape = dict(q_lens=[16], prefix_lens=[8000], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4)
    shape.update(kw)
    return cases.prefill_case(arch="sm90", pattern=pattern, seed=seed, future_prob=0.0, **shape)


def _inflation(case, block_t):
    a = case.args
    return tile_inflation(a["topk_idx"], block_t, a["cu_seqlens_q"], a["prefix_lens"]).item()


def test_inflation_separates_shared_from_unrelated_selections():
    # The benchmark's shapes, scaled down: 16 picks of 128-token blocks after a long prefix.
    shape = dict(q_lens=[512], prefix_lens=[64 * 1024], head_dim=16, topk=16)
    correlated = _inflation(_case("correlated", **shape), 4)
    unrelated = _inflation(_case("random", **shape), 4)
    assert 1.0 <= correlated < 1.5 < 3.0 < unrelated <= 4.0
    for mode in ("scalar", "none", "per_token_head"):
        assert correlated <= tiles_pay_off_below(4, mode) < unrelated


def test_inflation_counts_distinct_pages_exactly():
    # One KV head, two tiles of 2 tokens: {1, 2} + {1, 2} -> 2 pages, {3, -1} + {4, 5} -> 3 pages, 2.5
    # per tile; 7 valid picks over 4 tokens, 1.75 per token: 2.5 / 1.75.
    ids = torch.tensor([[[1, 2], [2, 1], [3, -1], [4, 5]]], dtype=torch.int32)
    cu, prefix = torch.tensor([0, 4]), torch.tensor([1000])  # positions 1000..1003: both entries read
    assert tile_inflation(ids, 2, cu, prefix).item() == pytest.approx(2.5 / 1.75)
    with pytest.raises(ValueError, match="block_t"):
        tile_inflation(ids, 1, cu, prefix)


def test_inflation_counts_only_the_entries_a_token_reads():
    # Positions 126..129: the first two tokens read one entry ({0}), the last two two ({1, 0}, {1, 0});
    # the tails (9, 2**31 - 1) and an id past the own block (5) are no picks. Two tiles of 2 tokens:
    # {0} and {0, 1} -> 1.5 pages per tile over 6 / 4 picks per token.
    ids = torch.tensor([[[0, 9], [0, 2 ** 31 - 1], [1, 0], [0, 1]]], dtype=torch.int32)
    cu, prefix = torch.tensor([0, 4]), torch.tensor([126])
    assert tile_inflation(ids, 2, cu, prefix).item() == pytest.approx(1.5 / 1.5)
    ids[0, 3, 1] = 5  # in the request, but after the token's own block: invisible, not loaded
    assert tile_inflation(ids, 2, cu, prefix).item() == pytest.approx(1.5 / 1.25)


def test_thresholds_per_scale_mode():
    # Kept tiles while inflation <= 1 + share x (block_t - 1) / 2 (the H200 brackets in selection.py).
    assert [tiles_pay_off_below(4, m) for m in ("scalar", "none", "per_token_head")] == [2.5, 2.5, 2.5]
    assert tiles_pay_off_below(8, "scalar") == 4.5 and tiles_pay_off_below(2, "scalar") == 1.5
    with pytest.raises(ValueError, match="scale_mode: expected one of"):
        tiles_pay_off_below(4, "fp8")


def test_split_seqlens_gives_one_path_the_offsets_and_the_other_zeros():
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    tiled, per_token = split_seqlens(cu, torch.tensor(True))
    assert tiled.tolist() == [0, 5, 9] and per_token.tolist() == [0, 0, 0] and tiled.dtype == torch.int32
    tiled, per_token = split_seqlens(cu, torch.tensor(False))
    assert tiled.tolist() == [0, 0, 0] and per_token.tolist() == [0, 5, 9]


def test_a_launch_on_zeroed_offsets_writes_nothing():
    case = _case("random")
    a = case.args
    case.poison()
    before = a["output"].clone()
    load_module("sm90", "prefill", "scalar").launch(
        a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], torch.zeros_like(a["cu_seqlens_q"]), a["seq_lens"],
        a["prefix_lens"], a["max_query_len"], a["num_kv_heads"], a["sm_scale"], a["output"], a["k_scale"],
        a["v_scale"], LaunchConfig(block_n=32))
    assert torch.equal(a["output"].nan_to_num(1e9), before.nan_to_num(1e9))


@pytest.mark.parametrize("pattern,tiles", [("correlated", True), ("random", False)])
def test_auto_runs_the_chosen_path_and_matches_the_reference(pattern, tiles):
    """The device's decision hands the call's offsets to one launch and zeros to the other (both paths
    compute the same output, so the reference alone cannot tell which one ran)."""
    from codegen import api, modules, plan

    case = _case(pattern, seed=3)
    a = case.args
    assert bool(choose_tiles(a["topk_idx"], 4, "scalar", a["cu_seqlens_q"], a["prefix_lens"])) is tiles
    config = LaunchConfig(block_n=32, block_t=4)
    case.poison()
    plan.forget_plans()  # the call builds its plan inside the block
    with cases.prefill_launch_offsets() as offsets:
        out = cases.run_kernel(case, arch="sm90", config=config, selection="auto")
    assert api.load_module is modules.load_module, "the spy is gone after the block"
    result = compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, config))
    assert result.ok, f"{pattern}: {result}"
    cu, zeros = a["cu_seqlens_q"], torch.zeros_like(a["cu_seqlens_q"])
    assert sorted(offsets) == [1, 4]
    assert torch.equal(offsets[4], cu if tiles else zeros), f"{pattern}: the tiles got {offsets[4].tolist()}"
    assert torch.equal(offsets[1], zeros if tiles else cu), f"{pattern}: the walk got {offsets[1].tolist()}"


def test_selection_argument_is_checked():
    case = _case("random")
    with pytest.raises(ValueError, match="selection: expected one of"):
        cases.run_kernel(case, arch="sm90", selection="fast")
    with pytest.raises(ValueError, match="config.block_t: selection='per_token' needs 1, got 4"):
        cases.run_kernel(case, arch="sm90", config=LaunchConfig(block_t=4), selection="per_token")


def test_default_selection_runs_a_given_config_as_given(monkeypatch):
    from codegen import api

    launched = []
    real = api.load_module

    class Spy:
        def __init__(self, module):
            self.module = module

        def launch(self, *args, **kwargs):
            launched.append(args[-1].block_t)  # the config is the last positional argument
            return self.module.launch(*args, **kwargs)

    monkeypatch.setattr(api, "load_module", lambda *a: Spy(real(*a)))
    case = _case("random")
    for kw, expected in ((dict(config=LaunchConfig(block_t=4)), [4]),  # given: tiled, one launch
                         (dict(config=LaunchConfig(block_t=4), selection="auto"), [4, 1]),  # both paths
                         (dict(), [1])):  # loader's pick on the CPU: the per-token default, nothing to decide
        launched.clear()
        cases.run_kernel(case, arch="sm90", **kw)
        assert launched == expected, kw


class _Recorded(Exception):
    """Raised by the bind_recorded stand-in below: the plan's launches, before anything runs."""


@pytest.mark.parametrize("kw,kernels", [
    (dict(config=LaunchConfig(block_t=4), selection="auto"), 3),  # decision, tiles, per-token walk
    (dict(config=LaunchConfig(block_t=4)), 1),
    (dict(config=LaunchConfig(), selection="per_token"), 1),
], ids=["auto", "tiled", "per_token"])
def test_every_prefill_launch_is_under_pdl_and_waits(monkeypatch, kw, kernels):
    """On a Hopper GPU every launch of a prefill call goes under programmatic dependent launch, and
    each such kernel gets USE_PDL (its griddepcontrol.wait before any read: tests/static's
    test_pdl_launches_wait_before_reading). A launch under PDL whose kernel does not wait would read
    `auto`'s offsets before the decision wrote them. Off the GPU (the interpreter) none is."""
    from codegen import api

    def record(recorded, *_, **__):
        raise _Recorded(recorded)

    monkeypatch.setattr(api, "bind_recorded", record)
    case = _case("random")
    for on in (True, False):
        monkeypatch.setattr(api, "_use_pdl", lambda q, on=on: on)
        with pytest.raises(_Recorded) as got:
            cases.run_kernel(case, arch="sm90", **kw)
        recorded = got.value.args[0]
        assert len(recorded) == kernels
        for kernel, _, _, kwargs in recorded:
            assert kwargs.get("launch_pdl", False) is on and kwargs.get("USE_PDL", False) is on, kernel


@pytest.mark.parametrize("pattern,q_lens,prefix_lens,block_t,topk", [
    ("correlated", [40], [9000], 4, 4),
    ("random", [40], [9000], 4, 4),
    ("random", [7, 30, 1, 13], [300, 0, 5000, 128], 2, 4),  # tiles straddling requests, a 1-token request
    ("random", [33, 20], [20000, 700], 8, 16),
    ("correlated", [3], [10], 4, 4),  # fewer tokens than a tile: nothing sampled
])
def test_one_launch_decision_matches_the_torch_estimate(pattern, q_lens, prefix_lens, block_t, topk):
    from codegen import selection, selection_kernel
    from codegen.workspace import arrival_counters

    case = _case(pattern, seed=5, q_lens=q_lens, prefix_lens=prefix_lens, topk=topk)
    a = case.args
    ids = a["topk_idx"]
    ids[:, ::5, -1] = -1  # pads and an id past the token's own block are no picks
    ids[:, 1::7, 0] = 2 ** 31 - 1
    cu, prefix = a["cu_seqlens_q"], a["prefix_lens"]
    for r in range(len(q_lens)):  # the block right after the token's own: in the cache, not visible
        for t in range(int(cu[r]) + 2, int(cu[r + 1]), 9):
            ids[:, t, 1] = (int(prefix[r]) + t - int(cu[r])) // 128 + 1
    want = tile_inflation(ids, block_t, cu, prefix, sampled_tiles=6) if sum(q_lens) >= block_t else None
    for threshold, tiles in ((1e9, True), (0.0, False)):
        got = torch.full((1,), float("nan"))
        tiled, per_token = selection_kernel.decide_and_split(ids, block_t, threshold, cu, prefix, 6, got)
        if want is None:
            assert got.item() == 1.0 and torch.equal(tiled, cu) and not per_token.any()
            continue
        assert got.item() == pytest.approx(want.item(), rel=1e-6)
        want_tiled, want_per_token = selection.split_seqlens(cu, torch.tensor(tiles))
        assert torch.equal(tiled, want_tiled) and torch.equal(per_token, want_per_token)
        assert tiled.dtype == cu.dtype
    assert not arrival_counters(ids.device, 3, key="selection")[:3].any()  # zero again for the next call
    with pytest.raises(ValueError, match="block_t"):
        selection_kernel.decide_and_split(ids, 1, 1.0, cu, prefix, 6)


def test_auto_decides_in_one_launch_without_the_torch_estimate(monkeypatch):
    """The API's auto path: one decision launch (codegen.selection_kernel), never the torch estimate
    (~20 graph nodes on a GPU); both prefill launches follow it."""
    from codegen import api, selection, selection_kernel

    calls = []
    real = selection_kernel.decide_and_split
    monkeypatch.setattr(selection_kernel, "decide_and_split", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    for name in ("tile_inflation", "choose_tiles", "split_seqlens"):
        monkeypatch.setattr(selection, name, lambda *a, _n=name, **k: pytest.fail(f"auto called selection.{_n}"))
    case = _case("random", seed=4)
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=LaunchConfig(block_n=32, block_t=4), selection="auto")
    assert calls == [4]
    assert compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, LaunchConfig())).ok
    assert api.selection_kernel is selection_kernel


def test_fill_factor_keeps_the_threshold_where_tiles_fill_the_gpu():
    from codegen.selection import fill_factor

    # 8k tokens of 4 KV heads in 8-token tiles: 4096 tiles, far more than 132 SMs: the measured threshold.
    assert fill_factor(8192, 4, 8, 132) == pytest.approx(1.0)
    assert fill_factor(16, 1, 4, None) == 1.0  # no SM count (the interpreter): no model
    assert fill_factor(0, 1, 4, 132) == 1.0
    # TP1 128 tokens: 64 tiles (one wave, half the SMs idle) against 512 per-token programs (3.9 waves).
    assert fill_factor(128, 4, 8, 132) == pytest.approx(512 / 132 / 8)
    # Both paths under one wave: a tile's steps against one token's.
    assert fill_factor(16, 1, 4, 132) == pytest.approx(1 / 4)
    # The factor only shrinks as a call shrinks.
    factors = [fill_factor(n, 1, 8, 132) for n in (8, 64, 256, 1024, 2048, 8192)]
    assert factors == sorted(factors) and factors[-1] == pytest.approx(1.0)
    for bad in (dict(total_q=-1), dict(num_kv_heads=0), dict(block_t=0), dict(sm_count=0)):
        args = dict(total_q=16, num_kv_heads=1, block_t=4, sm_count=132) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            fill_factor(**args)


def test_auto_scales_its_threshold_by_the_call_fill(monkeypatch):
    """On a GPU the API passes the decision launch the threshold times fill_factor at the device's SM
    count: a 16-token call of 2 KV heads in 4-token tiles keeps a quarter of it at 132 SMs."""
    from codegen import api, selection, selection_kernel

    thresholds = []
    real = selection_kernel.decide_and_split
    monkeypatch.setattr(selection_kernel, "decide_and_split",
                        lambda *a, **k: thresholds.append(a[2]) or real(*a, **k))
    monkeypatch.setattr(api, "_sm_count", lambda device: 132)
    case = _case("correlated", seed=6)
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=LaunchConfig(block_n=32, block_t=4), selection="auto")
    assert thresholds == [pytest.approx(selection.tiles_pay_off_below(4, "scalar") * selection.fill_factor(16, 2, 4, 132))]
    assert thresholds[0] == pytest.approx(2.5 / 4)
    assert compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, LaunchConfig())).ok


def test_auto_threshold_judges_the_tiles_auto_measures():
    """The Gluon tile is judged at its own block_t, the Triton tiles at the sampled one; both keep the
    inflation bound of that size times the call's fill (the API and selection_check share this)."""
    from codegen.selection import MAX_SAMPLED_BLOCK_T, auto_threshold, fill_factor, tiles_pay_off_below

    big = dict(total_q=8192, num_kv_heads=4, sm_count=132)
    assert auto_threshold(16, "scalar", gluon=True, **big) == (16, pytest.approx(tiles_pay_off_below(16, "scalar")))
    assert auto_threshold(16, "scalar", gluon=False, **big) == (
        MAX_SAMPLED_BLOCK_T, pytest.approx(tiles_pay_off_below(MAX_SAMPLED_BLOCK_T, "scalar")))
    small = dict(total_q=128, num_kv_heads=4, sm_count=132)
    judged, limit = auto_threshold(8, "per_token_head", gluon=False, **small)
    assert judged == 8 and limit == pytest.approx(4.5 * fill_factor(128, 4, 8, 132)) and limit < 4.5
