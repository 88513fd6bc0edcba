"""The warp-specialized Gluon prefill tile (prefill_ws, sm90) on a CPU: its plan, and its plumbing.

The Gluon kernel (`_prefill_ws_kernel`) cannot run under the interpreter, but its plan kernel
(`_tile_plan_kernel`, Triton language, templates/_tile_plan.jinja) can. These tests run the plan
kernel exactly as each generated module's launch() records it, check every program's plan against
the macro's documented rule re-derived here in Python, then emulate the Gluon kernel's arithmetic
from the plan alone (float64 torch: the page of each step, V rows past n_vis zeroed, masks only on
partial steps, one softmax over all steps, the scale mode's scales where the kernel applies them)
and compare with codegen's float64 reference. A plan that drops, adds or repeats a page, gets a
token bit, `whole` or n_vis wrong, or lets a NaN slot past a request's end through, fails.
The Gluon kernel's own accuracy gates are tests/gpu/test_ws_gpu.py; the config and API plumbing
(validation, variants, loader parts, the CPU fallback) is checked at the end without kernel runs
(but for the fallback, which runs the interpreter's Triton tile).
"""
import dataclasses
import importlib
import json
import math
from collections import Counter

import pytest
import torch

from codegen import cases, loader, tuned_store
from codegen import plan as call_plans
from codegen import selection as tile_selection
from codegen.accuracy import compare
from codegen.configs import (WS_CONVERT_ROWS, LaunchConfig, default_config, per_token_twin,
                             validate_config, ws_config)
from codegen.variants import PAGE_SIZE, WS_SCALE_MODES, Variant, all_variants, has_variant

WS_MODULES = {mode: f"codegen.generated.sm90_prefill_ws_{mode}" for mode in WS_SCALE_MODES}
# GQA -> (query heads, KV heads): 16 with two KV heads (the plan's head index and strides), 8 with one.
LAYOUTS = {16: (32, 2), 8: (8, 1)}
# float64 emulation vs the float64 reference, on the same exactly representable inputs (fp8 and fp32
# values are exact in float64): they differ only in summation order (a softmax over the plan's
# steps vs over the token's concatenated keys): measured 6e-16 to 1e-15 relative L2. 1e-12 leaves
# room for that and still sees any wrong key, mask, scale or page, which moves the output by > 1e-3.
EMULATION_TOL = 1e-12
RAGGED = dict(q_lens=[100, 77, 40, 5], prefix_lens=[60, 200, 1500, 129], pattern="random", future_prob=0.3,
              tail="mixed", inner_junk=0.1)
# Tiles crossing a page (positions 60..159, 200..276, 1500..1539), a 5-token request (one short
# tile), requests' last pages partly filled (NaN past their ends); junk among the read entries and
# after them; future blocks (listed, all keys masked).


def _case(mode, gqa, seed=0, **kw):
    hq, hkv = LAYOUTS[gqa]
    return cases.prefill_case(arch="sm90", num_q_heads=hq, num_kv_heads=hkv, kv_dtype="fp8", scale_mode=mode,
                              q_dtype=torch.float32, seed=seed, **kw)


def _launch_args(case):
    a = case.args
    return (a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["cu_seqlens_q"], a["seq_lens"],
            a["prefix_lens"], a["max_query_len"], a["num_kv_heads"], a["sm_scale"], a["output"], a["k_scale"],
            a["v_scale"])


@dataclasses.dataclass
class Plan:
    grid: tuple
    block_t: int
    steps: dict  # prog -> [(page, blk, whole, tokens, n_vis)], the first `count` words of its rows
    counts: list


def _run_plan(module, case, config) -> Plan:
    """The module's plan launch as launch() records it, run on the interpreter; its scratch decoded."""
    recorded = []
    module.launch(*_launch_args(case), config, record=recorded)
    assert [r[0] for r in recorded] == [module.PLAN_KERNEL, module.KERNEL]
    (plan_kernel, grid, plan_args, plan_kwargs), (_, ws_grid, ws_args, ws_kwargs) = recorded
    scratch = plan_args[5]
    assert ws_grid == grid and ws_args[2] is scratch  # the Gluon kernel reads the scratch written here
    PLAN, block_t = plan_kwargs["PLAN"], plan_kwargs["BLOCK_T"]
    assert block_t == config.block_t == ws_kwargs["BLOCK_T"] and PLAN == ws_kwargs["PLAN"]
    programs = math.prod(grid)
    assert scratch.dtype == torch.int64 and scratch.numel() == programs * (2 * PLAN + 1)
    scratch.fill_(-(2 ** 62))  # a word the kernel should have written and did not reads as garbage
    plan_kernel[grid](*plan_args, **plan_kwargs)
    words = scratch[: programs * 2 * PLAN].view(programs, 2, PLAN).tolist()
    counts = scratch[programs * 2 * PLAN:].tolist()
    steps = {}
    for prog, n in enumerate(counts):
        assert 0 <= n <= PLAN, f"program {prog}: {n} steps"
        steps[prog] = [(key >> 32, (key >> 1) & 0x7FFFFFFF, key & 1, aux >> 8, aux & 0xFF)
                       for key, aux in zip(words[prog][0][:n], words[prog][1][:n])]
    return Plan(grid, block_t, steps, counts)


def _tile(case, req, i0, block_t, g):
    """A tile's tokens as the plan sees them: per token, kv_end and the entries it reads."""
    a = case.args
    q_start = int(a["cu_seqlens_q"][req])
    q_len = int(a["cu_seqlens_q"][req + 1]) - q_start
    prefix, seq_len = int(a["prefix_lens"][req]), int(a["seq_lens"][req])
    topk = a["topk_idx"].shape[2]
    n_tok = min(q_len - i0, block_t)
    kv_end = [min(prefix + i0 + t + 1, seq_len) for t in range(n_tok)]
    rows = [a["topk_idx"][g, q_start + i0 + t, : min(topk, -(-kv_end[t] // PAGE_SIZE))].tolist()
            for t in range(n_tok)]
    return q_start, n_tok, kv_end, rows


def _expected_steps(case, req, i0, block_t, g):
    """The macro's rule (templates/_tile_plan.jinja), re-derived: the tile's live listings (block in
    [0, tile_blocks), tile_blocks the pages the tile's last token may see) in (token, entry) order,
    each (block, rank) once, at its first listing (rank: earlier listings of the block in the same
    token's row); the step's tokens are those listing the block more than `rank` times; whole when
    every token of the tile gets it and sees all 128 keys; n_vis the most keys any of them sees.
    Note the order: first listing in (token, entry) order, not ascending block order."""
    _, n_tok, kv_end, rows = _tile(case, req, i0, block_t, g)
    tile_blocks = -(-kv_end[-1] // PAGE_SIZE)
    table = case.args["block_table"]
    steps, seen = [], set()
    for row in rows:
        for k, blk in enumerate(row):
            rank = row[:k].count(blk)
            if not 0 <= blk < tile_blocks or (blk, rank) in seen:
                continue
            seen.add((blk, rank))
            getters = [t for t in range(n_tok) if rows[t].count(blk) > rank]
            sees = {t: min(max(kv_end[t] - blk * PAGE_SIZE, 0), PAGE_SIZE) for t in getters}
            whole = int(len(getters) == n_tok and all(s == PAGE_SIZE for s in sees.values()))
            steps.append((int(table[req, blk]), blk, whole, sum(1 << t for t in getters), max(sees.values())))
    return steps


def _check_plan(case, plan: Plan):
    """Every program's plan is the macro's rule; tiles past a request's end have no step. Returns the
    number of (whole, partial) steps seen."""
    a = case.args
    tiles, num_reqs, num_kv_heads = plan.grid
    seen = Counter()
    for g in range(num_kv_heads):
        for req in range(num_reqs):
            q_len = int(a["cu_seqlens_q"][req + 1] - a["cu_seqlens_q"][req])
            for tile in range(tiles):
                prog = tile + tiles * (req + num_reqs * g)
                i0 = tile * plan.block_t
                where = f"KV head {g}, request {req}, tile {tile}"
                if i0 >= q_len:
                    assert plan.counts[prog] == 0, f"{where}: past the request's end, {plan.counts[prog]} steps"
                    continue
                got = plan.steps[prog]
                expected = _expected_steps(case, req, i0, plan.block_t, g)
                # aux is only meaningful on partial steps: compare (tokens, n_vis) there only.
                trim = lambda s: s if not s[2] else s[:3]  # noqa: E731
                assert [trim(s) for s in got] == [trim(s) for s in expected], where
                # Each (page, listing rank) once: a block has as many steps as the most times one token
                # of the tile lists it, and a page belongs to one block.
                _, _, _, rows = _tile(case, req, i0, plan.block_t, g)
                per_block = Counter(blk for _, blk, *_ in got)
                assert per_block == {b: max(r.count(b) for r in rows) for b in per_block}, where
                assert len({(page, blk) for page, blk, *_ in got}) == len(per_block), where
                seen.update("whole" if s[2] else "partial" for s in got)
    return seen


def _emulate(case, plan: Plan):
    """The Gluon kernel's arithmetic from the plan alone, in float64: [total_q, Hq, D]. Rows of a
    program: token t = r // GQA of the tile, head g * GQA + r % GQA."""
    a = case.args
    q, kv = a["q"].double(), a["kv_cache"]
    total_q, hq, D = q.shape
    tiles, num_reqs, num_kv_heads = plan.grid
    gqa = hq // num_kv_heads
    per_token = case.scale_mode == "per_token_head"
    score_scale = a["sm_scale"] * (1.0 if per_token else float(a["k_scale"]))
    out_scale = 1.0 if per_token else float(a["v_scale"])
    slots = torch.arange(PAGE_SIZE)
    out = torch.full((total_q, hq, D), float("nan"), dtype=torch.float64)
    for g in range(num_kv_heads):
        for req in range(num_reqs):
            prefix, seq_len = int(a["prefix_lens"][req]), int(a["seq_lens"][req])
            q_len = int(a["cu_seqlens_q"][req + 1] - a["cu_seqlens_q"][req])
            for tile in range(tiles):
                i0 = tile * plan.block_t
                if i0 >= q_len:
                    continue
                q_start, n_tok, _, rows = _tile(case, req, i0, plan.block_t, g)
                qt = q[q_start + i0: q_start + i0 + n_tok, g * gqa:(g + 1) * gqa].reshape(n_tok * gqa, D)
                row_t = torch.arange(n_tok * gqa) // gqa
                kv_end = torch.clamp(prefix + i0 + row_t + 1, max=seq_len)
                scores, values = [], []
                steps = plan.steps[tile + tiles * (req + num_reqs * g)]
                for j, (page, blk, whole, tokens, n_vis) in enumerate(steps):
                    if whole:  # the kernel reads no aux (other=PAGE): no token bits, every slot visible
                        tokens, n_vis = 0, PAGE_SIZE
                    vis = slots < n_vis
                    k = kv[page, g, :, :D].double()
                    v = torch.where(vis[:, None], kv[page, g, :, D:].double(), 0.0)  # the tail may be NaN
                    if per_token:
                        base = page * PAGE_SIZE
                        k = k * torch.where(vis, a["k_scale"][g, base: base + PAGE_SIZE].double(), 0.0)[:, None]
                        v = v * torch.where(vis, a["v_scale"][g, base: base + PAGE_SIZE].double(), 0.0)[:, None]
                    s = (qt @ k.T) * score_scale
                    lim = (kv_end - blk * PAGE_SIZE)[:, None]  # row r sees slot n < kv_end - blk * 128 ...
                    if whole:
                        # ... and a whole step masks nothing: every token lists the block (at least as
                        # often as the steps of this block so far) and sees all 128 of its keys.
                        rank = [b for _, b, *_ in steps[:j]].count(blk)
                        assert all(r.count(blk) > rank for r in rows) and bool((lim >= PAGE_SIZE).all()), \
                            f"whole step {j} (block {blk}) of KV head {g}, request {req}, tile {tile} would mask"
                    else:  # ... if its token's bit is set
                        gets = ((tokens >> row_t) & 1).bool()[:, None]
                        s = torch.where(gets & (slots[None, :] < lim), s, float("-inf"))
                    scores.append(s)
                    values.append(v)
                o = torch.zeros(n_tok * gqa, D, dtype=torch.float64)
                if scores:
                    s = torch.cat(scores, dim=1)
                    m = s.max(dim=1, keepdim=True).values
                    p = torch.exp(s - torch.where(m == float("-inf"), 0.0, m))
                    l_sum = p.sum(dim=1, keepdim=True)
                    o = (p @ torch.cat(values)) / torch.where(l_sum > 0, l_sum, 1.0)  # nothing seen: zeros
                out[q_start + i0: q_start + i0 + n_tok, g * gqa:(g + 1) * gqa] = o.reshape(n_tok, gqa, D) * out_scale
    return out


def _emulation_matches(case, plan, ref):
    result = compare(_emulate(case, plan), ref, torch.float32)  # the float32 gate's figures, judged tighter
    assert result.unwritten == 0, f"non-finite emulated outputs: {result}"
    assert result.rel_l2 <= EMULATION_TOL and result.max_abs <= EMULATION_TOL, str(result)


def _reference_then_poison(case):
    """The reference reads whole pages, so it comes first; then the slots past each request's end
    hold NaN, which the emulation (as the kernel) must never let through."""
    ref = cases.run_reference(case, torch.float64)
    case.poison_past_the_end()
    assert torch.isnan(case.args["kv_cache"].double()).any()  # the poison is visible to the emulation
    return ref


@pytest.mark.parametrize("gqa", sorted(LAYOUTS))
@pytest.mark.parametrize("mode", WS_SCALE_MODES)
def test_plan_and_emulation_ragged(mode, gqa):
    """Ragged requests with prefixes, junk ids among and after the read entries, future blocks, and
    one token of request 2 that lists a fully visible block twice: the plan gives that page a second
    step (rank 1) for that token alone, and the emulated tile matches the reference."""
    case = _case(mode, gqa, seed=gqa, **RAGGED)
    config = ws_config(gqa=gqa)
    a = case.args
    t_local = 22  # request 2's token at position 1522 (block 11; reads 12 entries)
    t = int(a["cu_seqlens_q"][2]) + t_local
    dup = 1522 // PAGE_SIZE - 1  # block 10: all 128 keys visible to the token
    row = a["topk_idx"][:, t, :12]  # a view: the token's read entries
    row.masked_fill_(row == dup, -1)  # listed exactly twice: here, first and second
    row[:, :2] = dup
    ref = _reference_then_poison(case)
    plan = _run_plan(importlib.import_module(WS_MODULES[mode]), case, config)
    seen = _check_plan(case, plan)
    assert seen["partial"] > 0
    # The doubled listing's second step: a partial step of that one token, all 128 slots.
    tiles, num_reqs, _ = plan.grid
    tile, bit = divmod(t_local, config.block_t)
    for g in range(a["num_kv_heads"]):
        steps = plan.steps[tile + tiles * (2 + num_reqs * g)]
        dup_steps = [s for s in steps if s[1] == dup]
        doubled = sum(r.count(dup) >= 2 for r in _tile(case, 2, tile * config.block_t, config.block_t, g)[3])
        assert doubled == 1 and len(dup_steps) == 2, dup_steps
        assert dup_steps[1][2:] == (0, 1 << bit, PAGE_SIZE), dup_steps
    _emulation_matches(case, plan, ref)


@pytest.mark.parametrize("mode", WS_SCALE_MODES)
def test_plan_and_emulation_correlated(mode):
    """A serving-like correlated selection (tiles share most pages: whole steps), long enough that
    tokens read only their first topk entries of more blocks."""
    case = _case(mode, 16, seed=5, q_lens=[24, 13], prefix_lens=[2500, 300], pattern="correlated",
                 future_prob=0.0, tail="own")
    ref = _reference_then_poison(case)
    plan = _run_plan(importlib.import_module(WS_MODULES[mode]), case, ws_config(gqa=16, convert_rows=64))
    seen = _check_plan(case, plan)
    assert seen["whole"] > 0 and seen["partial"] > 0, seen
    _emulation_matches(case, plan, ref)


def _picks(case, g):
    """A token's picks, summed over the batch for KV head g: its read entries naming a block it may see."""
    a = case.args
    total = 0
    for req in range(a["seq_lens"].numel()):
        q_len = int(a["cu_seqlens_q"][req + 1] - a["cu_seqlens_q"][req])
        _, _, kv_end, rows = _tile(case, req, 0, q_len, g)
        total += sum(sum(0 <= blk <= (end - 1) // PAGE_SIZE for blk in row) for end, row in zip(kv_end, rows))
    return total


@pytest.mark.parametrize("pattern", ["correlated", "random"])
@pytest.mark.parametrize("gqa", sorted(LAYOUTS))
def test_plan_launch_decides_auto(gqa, pattern):
    """selection='auto' inside the plan launch: the inflation is the tiles' steps x block_t over the
    tokens' picks, exactly (every tile, every KV head); a threshold just above it keeps the tiles, one
    just below sends the batch to the per-token launch (the other launch's cu_seqlens all zeros); the
    counters are back to zero after each call; the Gluon kernel reads the tiled launch's offsets."""
    from codegen.selection_kernel import PlanDecision

    module = importlib.import_module(WS_MODULES["scalar"])
    case = _case("scalar", gqa, seed=3, **{**RAGGED, "pattern": pattern})
    config = ws_config(gqa=gqa)
    a = case.args
    plan = _run_plan(module, case, config)  # the plan without the decision, for the expected steps
    _check_plan(case, plan)  # its steps are the rule's, so the expected inflation does not come from the kernel alone
    steps = sum(plan.counts)
    expected = steps * config.block_t / sum(_picks(case, g) for g in range(a["num_kv_heads"]))
    counters = torch.zeros(3, dtype=torch.int32)
    cu = a["cu_seqlens_q"]
    for threshold, tiles in ((expected * 1.001, True), (expected * 0.999, False)):
        decide = PlanDecision.for_call(cu, threshold, counters)
        recorded = []
        module.launch(*_launch_args(case), config, record=recorded, decide=decide)
        (plan_kernel, grid, plan_args, plan_kwargs), (_, _, ws_args, _) = recorded
        assert plan_kwargs["DECIDE"] and ws_args[3] is decide.tiled_cu and plan_args[2] is cu
        plan_kernel[grid](*plan_args, **plan_kwargs)
        assert float(decide.inflation) == pytest.approx(expected, rel=1e-6)
        assert torch.equal(decide.tiled_cu, cu if tiles else torch.zeros_like(cu))
        assert torch.equal(decide.per_token_cu, torch.zeros_like(cu) if tiles else cu)
        assert counters.tolist() == [0, 0, 0]
        assert plan_args[5][-math.prod(grid):].sum().item() == steps  # the counts as without DECIDE
    assert expected > 1.0  # ragged tiles: some steps serve fewer than all of a tile's tokens


def test_plan_launch_with_nothing_to_plan_keeps_the_tiles():
    """A batch of no query tokens launches nothing; `auto`'s verdict is the tiles' (inflation 1, as
    tile_inflation's for nothing to sample), its offsets written on the host side of the launch."""
    from codegen.selection_kernel import PlanDecision

    module = importlib.import_module(WS_MODULES["scalar"])
    case = _case("scalar", 16, q_lens=[3], prefix_lens=[10])
    args = list(_launch_args(case))
    args[7] = 0  # max_query_len
    cu = case.args["cu_seqlens_q"]
    decide = PlanDecision.for_call(cu, 4.5, torch.zeros(3, dtype=torch.int32))
    decide.tiled_cu.fill_(-1)
    decide.per_token_cu.fill_(-1)
    recorded = []
    module.launch(*args, ws_config(gqa=16), record=recorded, decide=decide)
    assert recorded == []
    assert torch.equal(decide.tiled_cu, cu) and not decide.per_token_cu.any() and float(decide.inflation) == 1.0


# ---------------------------------------------------------------------------------------------------------
# Config and plumbing (no kernel runs, but for the last test)

@pytest.mark.parametrize("gqa", sorted(LAYOUTS))
def test_ws_config_validates_for_sm90_prefill(gqa):
    for rows in WS_CONVERT_ROWS:
        config = ws_config(gqa=gqa, convert_rows=rows)
        assert config.block_t == 128 // gqa and config.warp_specialize == 1
        assert validate_config(config, arch="sm90", kernel="prefill", topk=16) is config


def _bad(field, value, base=None):
    return pytest.param(dataclasses.replace(base or ws_config(gqa=16), **{field: value}), field, id=f"{field}={value}")


@pytest.mark.parametrize("config, field", [
    _bad("block_n", 64), _bad("num_warps", 4), _bad("num_stages", 3), _bad("kv_upcast", 3), _bad("kv_tma", 0),
    _bad("convert_rows", 8), _bad("convert_rows", 0), _bad("block_t", 1), _bad("warp_specialize", 2),
    _bad("convert_rows", 32, LaunchConfig()),  # convert_rows without warp_specialize
])
def test_ws_config_rejections_name_the_field(config, field):
    with pytest.raises(ValueError, match=f"config.{field}"):
        validate_config(config, arch="sm90", kernel="prefill")


def test_ws_config_is_sm90_prefill_only():
    with pytest.raises(ValueError, match="config.warp_specialize"):
        validate_config(ws_config(gqa=16), arch="gfx942", kernel="prefill")
    with pytest.raises(ValueError, match="config.block_t"):  # decode programs hold one token
        validate_config(ws_config(gqa=16), arch="sm90", kernel="decode")
    with pytest.raises(ValueError, match="config.warp_specialize"):
        validate_config(dataclasses.replace(ws_config(gqa=16), block_t=1), arch="sm90", kernel="decode")


@pytest.mark.parametrize("gqa", sorted(LAYOUTS))
def test_per_token_twin_of_a_ws_config(gqa):
    twin = per_token_twin(ws_config(gqa=gqa, convert_rows=128), "sm90")
    assert twin.block_t == 1 and twin.warp_specialize == 0 and twin.convert_rows == 0
    assert twin == dataclasses.replace(default_config("sm90", "prefill", num_tokens=64, num_kv_heads=1), block_t=1)
    assert validate_config(twin, arch="sm90", kernel="prefill", topk=16) is twin


def test_prefill_ws_variants():
    ws = sorted(v.name for v in all_variants() if v.kernel == "prefill_ws")
    assert ws == ["sm90_prefill_ws_per_token_head", "sm90_prefill_ws_scalar"]
    for mode in ("none", "scalar", "per_token_head"):
        assert has_variant("sm90", "prefill_ws", mode) == (mode in WS_SCALE_MODES)
        assert not has_variant("gfx942", "prefill_ws", mode)
    assert not has_variant("sm90", "prefill_ws", "scalar", fold_scales=False)
    for arch, mode in (("gfx942", "scalar"), ("sm90", "none")):
        with pytest.raises(ValueError):
            Variant(arch, "prefill_ws", mode)
    for mode, name in WS_MODULES.items():
        module = importlib.import_module(name)
        assert module.ARCH == "sm90" and module.SCALE_MODE == mode
        assert module.PLAN_KERNEL is module._tile_plan_kernel and module.KERNEL is module._prefill_ws_kernel


def test_loader_prefill_parts():
    for mode in WS_SCALE_MODES:
        assert loader.prefill_parts("sm90", mode) == ["prefill", "prefill_ws"]
        assert loader.prefill_parts("gfx942", mode) == ["prefill"]
    assert loader.prefill_parts("sm90", "none") == ["prefill"]
    assert loader.prefill_parts("gfx942", "none") == ["prefill"]


def _small(mode="scalar", seed=3):
    # GQA 16, head_dim 128: a shape the Gluon tile is written for (only the CPU stops it).
    return cases.prefill_case(arch="sm90", q_lens=[5, 3], prefix_lens=[0, 130], num_q_heads=16, num_kv_heads=1,
                              topk=4, kv_dtype="fp8", scale_mode=mode, q_dtype=torch.float32, seed=seed)


def test_an_explicit_ws_config_raises_on_a_cpu():
    from codegen.api import sparse_attn_prefill

    case = _small()
    for config in (ws_config(gqa=16), ws_config(gqa=16).to_dict()):
        with pytest.raises(ValueError, match="config.warp_specialize"):
            sparse_attn_prefill(**case.args, arch="sm90", config=config)
        with pytest.raises(ValueError, match="config.warp_specialize"):
            sparse_attn_prefill(**case.args, arch="sm90", config=config, selection="auto")


@pytest.mark.parametrize("mode", WS_SCALE_MODES)
def test_a_tables_ws_config_falls_back_on_a_cpu(mode, tmp_path, monkeypatch):
    """A tuned prefill entry that asks for the Gluon tile: the CPU cannot run it, so the call runs the
    arch's default tile (no raise, the Gluon module never launched) and computes the right answer."""
    from codegen import api, get_config
    from codegen.api import sparse_attn_prefill

    case = _small(mode)
    hq, hkv = case.args["q"].shape[1], case.args["num_kv_heads"]
    doc = tuned_store.new_document("sm90", "cpu-interpreter")
    provenance = {key: None for key in tuned_store._PROVENANCE_KEYS}
    provenance.update(measured=True, arch="sm90", inputs_sha256=loader.current_inputs_sha256("sm90", "prefill", mode))
    doc["tables"][tuned_store.table_key("prefill", mode, "fp8", hq, hkv)] = {
        "provenance": provenance,
        "buckets": {"8": dict(config=ws_config(gqa=16, convert_rows=64).to_dict(), is_default=False,
                              default_us=10.0, tuned_us=8.0, trials=5, failures=0)},
    }
    path = tmp_path / tuned_store.file_name("sm90", "cpu-interpreter")
    path.write_text(json.dumps(tuned_store.validate_document(doc)))
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(tmp_path))
    loader._load.cache_clear()
    choice = get_config("prefill", "sm90", "cpu-interpreter", mode, "fp8", hq, hkv, 8, 4)
    assert choice.is_tuned and choice.config.warp_specialize == 1  # the table does ask for it

    ws_module = importlib.import_module(WS_MODULES[mode])
    monkeypatch.setattr(ws_module, "launch", lambda *a, **k: pytest.fail("the Gluon tile launched on a CPU"))
    # This 8-token request is short enough for auto's host rule (the per-token walk alone, no tiles):
    # the rule off, auto resolves the tiled config this test is about.
    monkeypatch.setattr(tile_selection, "PER_TOKEN_UP_TO", {})
    ref = cases.run_reference(case, torch.float64)
    case.poison()
    for selection in (None, "tiled"):  # None: "auto", as vLLM calls it
        call_plans.PLANS.clear()
        monkeypatch.setattr(api, "_WS_FALLBACKS_SAID", set())  # said once a reason: say it again here
        with pytest.warns(RuntimeWarning, match="run the arch default instead"):
            sparse_attn_prefill(**case.args, arch="sm90", selection=selection)
        (built,) = call_plans.PLANS._plans.values()
        assert built.config == default_config("sm90", "prefill", num_tokens=8, num_kv_heads=hkv)
        result = compare(case.output, ref)
        assert result.ok, f"{selection}: {result}"
        case.poison()


@pytest.mark.parametrize("use_pdl", [True, False])
def test_plan_and_tile_launch_under_pdl_together(use_pdl):
    """Both of the module's launches go under PDL or neither, each with its kernel's USE_PDL (the plan
    launch's wait orders the call after the launch before it; the tile's, after the plan)."""
    module = importlib.import_module(WS_MODULES["scalar"])
    recorded = []
    module.launch(*_launch_args(_case("scalar", 16, q_lens=[40], prefix_lens=[900])), ws_config(gqa=16),
                  use_pdl=use_pdl, record=recorded)
    assert [r[0] for r in recorded] == [module.PLAN_KERNEL, module.KERNEL]
    for kernel, _, _, kwargs in recorded:
        assert kwargs["launch_pdl"] is use_pdl and kwargs["USE_PDL"] is use_pdl, kernel
