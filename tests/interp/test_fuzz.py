"""The randomized tester (tests/fuzz) on the CPU: its own small cases pass under the interpreter, its
oracle agrees with codegen's reference (two implementations of the contract written apart), and it
catches what it exists to catch: a wrong output, a row left unwritten, a padded row not zeroed, a
write outside the output view, an error for valid arguments. Its GPU runs are scripts/gpu_check.sh's
`fuzz` part."""
import dataclasses

import pytest
import torch

from codegen import reference_decode, reference_prefill
from tests.fuzz import check, draw, oracle
from tests.fuzz import run as fuzz_run

SEEDS = range(100, 106)


@pytest.mark.parametrize("seed", SEEDS)
def test_small_cases_pass(seed):
    result = check.run_case(seed, "cpu", "cpu")
    assert result.ok, result.line()
    assert result.rel_l2 < 1e-5


@pytest.mark.parametrize("seed", range(200, 212))
def test_the_oracle_agrees_with_codegen_reference(seed):
    d = draw.draw(seed, "cpu")
    b = draw.build(d, "cpu", seed, torch.float8_e4m3fn)
    a = {**b.args, "output": None}
    ref = (reference_prefill if d.kernel == "prefill" else reference_decode)(**a)
    mine = check._expected(b)[0]
    torch.testing.assert_close(mine[~b.padded], ref[~b.padded].to(torch.float64), rtol=1e-9, atol=1e-9)


def test_draws_cover_the_space():
    draws = [draw.draw(s, "gpu") for s in range(3000)]
    seen = lambda f: {f(d) for d in draws}  # noqa: E731
    assert seen(lambda d: d.layout) == set(draw.LAYOUTS)
    assert seen(lambda d: d.head_dim) == {64, 128}
    assert seen(lambda d: d.topk) == set(range(4, 17))
    assert seen(lambda d: (d.scale_mode, d.kv_dtype)) == set(draw.MODES)
    assert seen(lambda d: d.q_dtype) == {"bf16", "fp16"}
    assert seen(lambda d: d.call) == set(draw.CALLS)
    assert seen(lambda d: d.selection) == set(draw.SELECTIONS)
    assert set().union(*seen(lambda d: d.views)) == set(draw.VIEWS)
    assert seen(lambda d: (d.kernel, d.uniform, d.padded_rows > 0)) >= {("decode", u, p) for u in (0, 1) for p in (0, 1)}
    prefill = [d for d in draws if d.kernel == "prefill"]
    assert max(sum(d.q_lens) for d in prefill) > 2048 and max(max(d.context) for d in prefill) > 100_000
    assert max(len(d.q_lens) for d in draws if d.kernel == "decode") > 128
    # max_seq_len= given, and within topk pages under `auto`: the tiles taken on the host (tiles_on_host)
    assert seen(lambda d: d.bounded) == {False, True} and not any(d.bounded for d in draws if d.kernel == "decode")
    assert any(d.bounded and d.selection == "auto" and check._longest(d) <= d.topk * 128 for d in prefill)


def test_the_issue_35_class_is_drawn_first():
    pinned = [draw.draw(s, "gpu") for s in range(len(draw.PINNED))]
    assert {(d.layout, d.selection) for d in pinned} == {(x, s) for x in ("tp8", "tp4", "tp1")
                                                         for s in ("auto", "tiled", "per_token")}
    assert all(d.scale_mode == "per_token_head" and "unaligned_rows" in d.views and d.q_dtype == "bf16"
               for d in pinned)


def test_unaligned_views_are_unaligned():
    d = dataclasses.replace(draw.draw(101, "cpu"), views=("unaligned_rows",))
    kv = draw.build(d, "cpu", 1, torch.float8_e4m3fn).args["kv_cache"]
    assert kv.stride(2) % 16 != 0
    d = dataclasses.replace(d, views=("unaligned_base",))
    kv = draw.build(d, "cpu", 1, torch.float8_e4m3fn).args["kv_cache"]
    assert kv.data_ptr() % 16 != 0


def _with_kernel(monkeypatch, edit):
    """The API's prefill and decode, with `edit(built, output)` applied to each output they write."""
    import codegen

    for name in ("sparse_attn_prefill", "sparse_attn_decode"):
        real = getattr(codegen, name)

        def spy(*args, _real=real, **kw):
            out = _real(*args, **kw)
            edit(out)
            return out

        monkeypatch.setattr(codegen, name, spy)


@pytest.mark.parametrize("fault,expected", [
    ("scale", "rel L2"),  # one row off by a wrong scale
    ("nan", "non-finite"),  # an element left unwritten
    ("raise", "raised RuntimeError"),
])
def test_a_faulty_kernel_fails_its_case(monkeypatch, fault, expected):
    def edit(out):
        if fault == "scale":
            out[0, 0] *= 1.3
        elif fault == "nan":
            out[-1, -1, -1] = float("nan")
        else:
            raise RuntimeError("boom")

    _with_kernel(monkeypatch, edit)
    result = check.run_case(SEEDS[0], "cpu", "cpu")
    assert not result.ok and expected in result.failure, result.line()
    assert f"--seed {SEEDS[0]}" in result.line()


def test_a_padded_row_not_zero_and_a_write_past_the_view_fail():
    d = dataclasses.replace(draw.draw(101, "cpu"), kernel="decode", q_lens=(1, 1), context=(40, 300), uniform=True,
                            padded_rows=2, views=("padded_output",), selection=None)
    b = draw.build(d, "cpu", 3, torch.float8_e4m3fn)
    expected = check._expected(b)
    b.args["output"].copy_(expected[0].to(b.args["output"].dtype))
    assert check.judge(d, b, expected)[3] == ""
    b.args["output"][-1, 0, 0] = 1.0
    assert "padded decode row" in check.judge(d, b, expected)[3]
    b.args["output"][-1, 0, 0] = 0.0
    b.output_base[0, 0, -1] = 0.0
    assert "outside the output view" in check.judge(d, b, expected)[3]


def test_the_command_fails_on_too_few_cases_and_bad_arguments(capsys):
    assert fuzz_run._summary([], [], 1, 0.0) == 1
    assert "too few cases" in capsys.readouterr().out
    ok = dict(seed=1, case="decode x", ok=True, rel_l2=0.0, worst_row=0.0, gate=0.1, seconds=0.1, failure="")
    assert fuzz_run._summary([ok], [], 1, 0.0) == 0
    assert fuzz_run._summary([ok], ["worker 0 ended with -11 during seed 9"], 1, 0.0) == 1
    for argv, said in ((["--seconds", "0"], "--seconds: expected a positive number"),
                       (["--seed", "-1"], "--seed: expected a seed >= 0"),
                       (["--workers", "0"], "--workers: expected a positive number")):
        with pytest.raises(SystemExit) as exit_info:
            fuzz_run.main(argv)
        assert exit_info.value.code == 2
        assert said in capsys.readouterr().err, argv  # the argument's own check, not any argparse error


def test_oracle_counts_a_repeated_entry_twice_and_zeroes_a_row_with_no_key():
    torch.manual_seed(0)
    kv = torch.randn(2, 1, 128, 8)
    q = torch.randn(2, 1, 4)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    pos = torch.tensor([200, 5])
    req = torch.zeros(2, dtype=torch.long)
    once = oracle.attention(q, kv, torch.tensor([[[1, 0], [-1, 0]]], dtype=torch.int32), table, req, pos, 0.5)
    twice = oracle.attention(q, kv, torch.tensor([[[1, 1], [-1, 0]]], dtype=torch.int32), table, req, pos, 0.5)
    assert not torch.allclose(once[0], twice[0])  # block 1 weighted twice against block 0's absence
    assert torch.equal(once[1], torch.zeros_like(once[1]))  # position 5 reads entry 0 only: -1


@pytest.mark.parametrize("seed", [300, 301, 302])
def test_the_sensitivity_predicts_the_move_of_rounded_scores(seed):
    """The oracle's sensitivity (the expected output move when the scores' operands are rounded, in
    units of the unit roundoff) against the real move: the same case with K rounded to bf16, with
    outlier queries. Every row moves by less than the gate's ROUNDING_SIGMAS times it (the bound
    holds), and the typical row by a good fraction of it (the bound is not vacuous)."""
    d = dataclasses.replace(draw.draw(seed, "cpu"), kernel="prefill", outliers=True, scale_mode="none",
                            kv_dtype="fp16", views=(), q_lens=(40, 30), context=(300, 0), selection=None)
    b = draw.build(d, "cpu", seed, torch.float8_e4m3fn)
    a = b.args
    q = a["q"].clone()
    q[:, :, :2] *= 25.0  # outlier entries
    exact, sens = oracle.attention(q, a["kv_cache"], a["topk_idx"], a["block_table"], b.token_req, b.token_pos,
                                   a["sm_scale"], sensitivity=True)
    k_bf16 = a["kv_cache"].clone()
    k_bf16[..., :d.head_dim] = k_bf16[..., :d.head_dim].to(torch.bfloat16).to(k_bf16.dtype)
    rounded = oracle.attention(q, k_bf16, a["topk_idx"], a["block_table"], b.token_req, b.token_pos, a["sm_scale"])
    move = (rounded - exact).norm(dim=-1)
    unit = check.TOLERANCES["bf16"][2]
    assert bool((move <= check.ROUNDING_SIGMAS * unit * sens).all())
    ratio = move / (unit * sens).clamp_min(1e-30)
    assert float(ratio.median()) > 0.1 and float(move.max() / exact.norm(dim=-1).max()) > 1e-3


def test_a_case_out_of_memory_beside_other_workers_is_judged_alone(monkeypatch, capsys):
    record = dict(case="decode x", rel_l2=0.0, worst_row=0.0, gate=0.1, seconds=0.1)
    oom = dict(record, seed=3, ok=False, failure="raised OutOfMemoryError: CUDA out of memory.")
    wrong = dict(record, seed=4, ok=False, failure="rel L2 0.3 over its gate")
    calls = []

    def pool(outcome_alone):
        def fake(commands, env, seconds):
            calls.append(commands)
            if len(calls) == 1:
                return [dict(record, seed=1, ok=True, failure=""), oom, wrong], []
            return [outcome_alone], []
        return fake

    monkeypatch.setattr(fuzz_run, "_pool", pool(dict(oom, ok=True, failure="")))
    argv = ["--workers", "2", "--seconds", "1", "--profile", "cpu"]
    assert fuzz_run.main(argv) == 1  # seed 4's wrong result still fails
    assert calls[1] == [calls[0][0][:-2] + ["--worker", "0", "--rerun", "3"]]  # only the out-of-memory seed
    out = capsys.readouterr().out
    assert "1 failed" in out and "FAILED seed=4" in out and "seed=3" not in out.split("cases (")[1]
    assert "1 re-run alone" in out

    calls.clear()
    wrong_alone = dict(oom, failure="raised OutOfMemoryError: CUDA out of memory.")
    monkeypatch.setattr(fuzz_run, "_pool", pool(wrong_alone))
    assert fuzz_run.main(argv) == 1  # out of memory alone too: a failure
    assert "FAILED seed=3" in capsys.readouterr().out


def test_listed_seeds_run_in_order_and_the_drawn_ones_step_by_workers():
    args = fuzz_run._parse(["--worker", "1", "--workers", "3", "--first-seed", "10", "--seconds", "60"])
    drawn = fuzz_run._seeds(args)
    assert [next(drawn) for _ in range(3)] == [11, 14, 17]
    args = fuzz_run._parse(["--worker", "0", "--rerun", "7,2,40"])
    assert list(fuzz_run._seeds(args)) == [7, 2, 40]
