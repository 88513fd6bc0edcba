"""Prefill's break-even (issue 37): bench.py's short-appends grid, built on the CPU, and
benchmarks/break_even.py on a small synthetic bench.json, run as a user runs it; the entries it
prints, pasted into codegen.selection, give the host rule they describe."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from codegen import selection

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench  # noqa: E402  (benchmarks/bench.py: its grid is built without a GPU)

LAYOUTS = {"tp1": (64, 4), "tp4": (16, 1), "tp8": (8, 1)}
QUERY_LENS = (16, 32, 64, 128, 256, 512)


# --- the grid ---------------------------------------------------------------------------------------

def test_the_short_appends_grid():
    specs = bench.grid("short-appends")
    labels = [s.label for s in specs]
    assert len(set(labels)) == len(specs)
    assert {s.kernel for s in specs} == {"prefill"} and {s.layout for s in specs} == set(LAYOUTS)
    assert {s.mode for s in specs} == {"scalar", "per_token_head"} and {s.tokens for s in specs} == set(QUERY_LENS)
    shapes = {(s.mode, s.layout, s.pattern, s.context, s.batch, s.tokens) for s in specs}
    correlated = {(m, l, "correlated", p, r, q) for m in ("scalar", "per_token_head") for l in LAYOUTS
                  for p in (1024, 8192, 128 * 1024) for r in (1, 4, 16) for q in QUERY_LENS}
    random = {(m, l, "random", p, r, q) for m in ("scalar", "per_token_head") for l in LAYOUTS
              for p in bench.SHORT_RANDOM["prefixes"] for r in bench.SHORT_RANDOM["requests"] for q in QUERY_LENS}
    assert correlated <= shapes and random <= shapes and shapes == correlated | random
    assert len(specs) == len(correlated) + len(random) == 396
    # Short token counts in full, whole thousands as before.
    assert "prefill tp1 scalar correlated 1x16 prefix1k" in labels
    assert "prefill tp8 per_token_head random 1x512 prefix128k" in labels
    assert bench.GRID_COLUMNS["short-appends"] == list(bench.SELECTION_COLUMNS) == ["tiled", "per_token", "auto"]
    assert bench.GRID_CALLS["short-appends"] == 10 and "serving" not in bench.GRID_CALLS
    # Correlated rows first (they bound the rule), by prefix: a run stopped at its limit keeps them.
    assert [s.pattern for s in specs] == ["correlated"] * len(correlated) + ["random"] * len(random)
    assert [s.context for s in specs[:len(correlated)]] == sorted(s.context for s in specs[:len(correlated)])


def test_the_other_grids_keep_their_labels():
    serving, quick = bench.grid("serving"), bench.grid("quick")
    assert len(serving) == 270 and len(quick) == 18 and bench.grid() == serving
    labels = {s.label for s in serving + quick}
    assert {"prefill tp1 scalar random 1x8k prefix120k", "prefill tp8 none correlated 4x2k prefix0k",
            "decode tp1 scalar b128 q4 ctx128k"} <= labels
    assert bench.Spec("prefill", "tp4", "scalar", 2, 1536, 1000).label == "prefill tp4 scalar random 2x1536 prefix1000"
    with pytest.raises(ValueError, match="grid: expected one of"):
        bench.grid("short")


def test_the_case_summary_carries_each_case_with_its_three_times():
    spec = bench.Spec("prefill", "tp4", "scalar", 4, 64, 8192, "correlated")
    rows = [dict(case=spec.label, spec=bench.dataclasses.asdict(spec), config=col, time_us=t, rel_l2=1e-3)
            for col, t in (("tiled", 48.0), ("per_token", 47.0), ("auto", 61.0))]
    rows.append(dict(case=spec.label, config='{"block_n": 16}', error="ValueError: x"))
    (case,) = bench.case_summary(rows, {spec.label: 1.5})
    assert case == dict(case=spec.label, kernel="prefill", layout="tp4", num_q_heads=16, num_kv_heads=1, gqa=16,
                        mode="scalar", pattern="correlated",
                        requests=4, query_len=64, prefix=8192, time_us=dict(tiled=48.0, per_token=47.0, auto=61.0),
                        rel_l2=dict(tiled=1e-3, per_token=1e-3, auto=1e-3), wall_s=1.5)


# --- the derivation -----------------------------------------------------------------------------------

def _per_token_us(layout, pattern, prefix, requests, query_len):
    """Synthetic times: tiled 100 us, auto 110 us, per_token by request count: 1 request q/2 (wins up
    to 128: 256/2 = 128 > 105), 4 requests q (up to 64, except one TP4 case that loses at 32: it stops
    TP4 alone, not TP1 of the same gqa), 16 requests 200 (never). Both scale modes alike."""
    if (layout, pattern, prefix, requests, query_len) == ("tp4", "random", 8192, 4, 32):
        return 300.0
    return {1: query_len / 2, 4: float(query_len), 16: 200.0}[requests]


WANT = {"sm90": {(mode, hq, hkv): ((1, 128), (4, 16 if (hq, hkv) == (16, 1) else 64), (16, 0))
                 for mode in ("scalar", "per_token_head") for hq, hkv in LAYOUTS.values()}}


def _bench_json(path, *, failed=False, host_rule=None):
    rows = []
    for mode in ("scalar", "per_token_head"):
        for layout in LAYOUTS:
            for pattern in ("correlated", "random"):
                for prefix in (1024, 8192):
                    for requests in (1, 4, 16):
                        for query_len in QUERY_LENS:
                            spec = bench.Spec("prefill", layout, mode, requests, query_len, prefix, pattern)
                            times = dict(tiled=100.0, auto=110.0,
                                         per_token=_per_token_us(layout, pattern, prefix, requests, query_len))
                            rows += [dict(case=spec.label, spec=bench.dataclasses.asdict(spec), config=col,
                                          time_us=t, rel_l2=1e-3) for col, t in times.items()]
    if failed:  # the losing case's per-token row could not run: it no longer counts
        bad = "prefill tp4 scalar random 4x32 prefix8k"
        rows = [r for r in rows if not (r["case"] == bad and r["config"] == "per_token")]
        rows.append(dict(case=bad, config="per_token", error="RuntimeError: out of resources"))
    path.write_text(json.dumps(dict(env=dict(arch="sm90", gpu="NVIDIA H200", date="d", host_rule=host_rule or {}),
                                    rows=rows)))
    return path


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "break_even.py"), *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def _entries(stdout: str) -> dict:
    text = stdout[stdout.index("PER_TOKEN_UP_TO"):]
    scope = {}
    exec(text, scope)  # the printed text is Python, as it would be pasted
    return scope["PER_TOKEN_UP_TO"]


def test_the_derivation_prints_the_ratios_and_the_entries(tmp_path):
    proc = _run(_bench_json(tmp_path / "bench.json"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = proc.stdout
    assert _entries(out) == WANT
    assert list(_entries(out)["sm90"])[:3] == [("scalar", 64, 4), ("scalar", 16, 1), ("scalar", 8, 1)]
    assert "        # scalar, 16/1 heads (tp4):\n" in out
    assert '        ("scalar", 16, 1): ((1, 128), (4, 16), (16, 0)),' in out
    assert "## scalar, tp1 (64/4 heads, gqa 16): per_token / tiled, auto / min(tiled, per_token)" in out
    assert "| pattern | requests | prefix | 16 | 32 | 64 | 128 | 256 | 512 |" in out
    # 1 request, 16 tokens: per_token 8 us / tiled 100 us; auto 110 us / 8 us
    assert "| correlated | 1 | 1k | 0.08 / 13.75 | 0.16 / 6.88 |" in out
    assert "#   4 requests: up to 16 (32: tp4 scalar random 4x32 prefix8k, per_token 3.00x min(tiled, auto))" in out
    assert "#   1 request: up to 128 (256: " in out and "up to 0 (16: " in out
    assert "accuracy: every column of every case within rel L2" in out


def test_the_margin_moves_the_bounds(tmp_path):
    proc = _run(_bench_json(tmp_path / "bench.json"), "--margin", "1.3")  # 128 / 100 and 256 / 2 / 100 <= 1.3
    assert proc.returncode == 0, proc.stderr
    assert _entries(proc.stdout)["sm90"][("scalar", 8, 1)] == ((1, 256), (4, 128), (16, 0))


def test_a_failed_column_leaves_its_case_out_by_name(tmp_path):
    proc = _run(_bench_json(tmp_path / "bench.json", failed=True))
    assert proc.returncode == 0, proc.stderr
    assert "left out (a column failed or is missing): prefill tp4 scalar random 4x32 prefix8k" in proc.stdout
    assert _entries(proc.stdout)["sm90"][("scalar", 16, 1)] == ((1, 128), (4, 64), (16, 0))  # no longer stopped at 32


def test_a_run_under_a_host_rule_says_so(tmp_path):
    proc = _run(_bench_json(tmp_path / "bench.json", host_rule={"scalar/16q1kv": [[1, 64]]}))
    assert proc.returncode == 0 and proc.stdout.startswith("note: auto ran under a host rule"), proc.stdout[:300]


def test_the_entries_pasted_give_the_host_rule_they_describe(tmp_path, monkeypatch):
    table = _entries(_run(_bench_json(tmp_path / "bench.json")).stdout)
    monkeypatch.setattr(selection, "PER_TOKEN_UP_TO", table)
    on_host = selection.per_token_on_host
    assert on_host("sm90", "scalar", 16, 1, 1, 128) and not on_host("sm90", "scalar", 16, 1, 1, 129)
    assert on_host("sm90", "scalar", 16, 1, 3, 16) and not on_host("sm90", "scalar", 16, 1, 3, 17)  # 4-request bucket
    assert on_host("sm90", "scalar", 64, 4, 3, 64)  # TP1 (same gqa as TP4) is not stopped by TP4's case
    assert on_host("sm90", "per_token_head", 8, 1, 4, 64) and not on_host("sm90", "per_token_head", 8, 1, 16, 1)
    assert not on_host("sm90", "scalar", 8, 1, 17, 1) and not on_host("gfx942", "scalar", 8, 1, 1, 16)
    assert not on_host("sm90", "scalar", 32, 2, 1, 16)  # a layout the run did not measure


@pytest.mark.parametrize("args, start", [
    ([], "break_even.py: the following arguments are required: bench_json"),
    (["/nonexistent.json"], "break_even.py: /nonexistent.json: cannot read it"),
    (["--margin", "0", "X"], "break_even.py: argument --margin: expected a number > 0, got 0.0"),
])
def test_a_wrong_argument_is_one_line_and_exit_2(args, start):
    proc = _run(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(start) and proc.stderr.count("\n") == 1, proc.stderr


def test_a_file_without_the_three_columns_is_refused(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(dict(env=dict(arch="sm90"), rows=[dict(case="x", config="runtime", time_us=1.0)])))
    proc = _run(path)
    assert proc.returncode == 2 and proc.stderr.startswith(f"break_even.py: {path}: no prefill case timed with all of"
                                                           " tiled, per_token, auto"), proc.stderr


def test_help():
    proc = _run("--help")
    assert proc.returncode == 0 and "usage" in proc.stdout and "margin" in proc.stdout, proc.stderr


def test_auto_as_shipped_takes_the_entries_then_the_device_decision(tmp_path):
    """(c) on the synthetic run (tiled 100 us, auto 110): inside the derived region auto is the per-token
    time (the faster path there), outside it the device decision, 1.1x or more over the faster path:
    280 of 432 cases; the worst is TP4's 4x32 (auto 110 us against per_token 32, outside TP4's bound
    of 16). Under a host rule the run's own auto column counts everywhere."""
    proc = _run(_bench_json(tmp_path / "bench.json"))
    line = proc.stdout.splitlines()[-1]
    assert line.startswith("# auto as shipped") and "432 cases" in line and line.endswith("over 1.05x in 280"), line
    assert "worst 3.44x (prefill tp4 " in line and "4x32 prefix" in line, line
    ran = _run(_bench_json(tmp_path / "bench.json", host_rule={"scalar/16q1kv": [[1, 64]]})).stdout.splitlines()[-1]
    assert ran.endswith("over 1.05x in 432"), ran  # auto (110 us) over every faster path
