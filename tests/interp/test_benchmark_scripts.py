"""The benchmark scripts on a machine without a GPU or with a wrong argument (issue 38): one line and a
non-zero exit (1 no GPU or a missing package, 2 a bad argument), never a traceback; every script
answers --help. Each runs as a user runs it, in a subprocess that sees no GPU."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH_JSON = REPO / "results/h200/fp8-scores/bench.json"  # a real run's file
HOST_JSON = REPO / "results/h200/lean-calls/host_after_final.json"


def _run(script: str, *args, cwd=None, hide_matplotlib=False):
    """`python benchmarks/SCRIPT ARGS` with no GPU visible; hide_matplotlib: as if it were not installed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    path = str(REPO / "benchmarks" / script)
    if hide_matplotlib:  # a None entry makes `import matplotlib` raise ImportError
        command = [sys.executable, "-c", "import runpy, sys; sys.modules['matplotlib'] = None; "
                   f"sys.argv = {[path, *map(str, args)]!r}; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); "
                   f"runpy.run_path({path!r}, run_name='__main__')"]
    else:
        command = [sys.executable, path, *map(str, args)]
    return subprocess.run(command, cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=300)


def _one_line(proc, rc: int, start: str) -> None:
    assert proc.returncode == rc, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.stderr.startswith(start) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == "", proc.stdout


@pytest.mark.parametrize("script", ["bench.py", "host_cost.py", "report.py", "plots.py", "kernel_census.py"])
def test_every_script_answers_help(script):
    proc = _run(script, "--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "usage" in proc.stdout.lower(), proc.stdout


@pytest.mark.parametrize("script, args", [("bench.py", ["--quick"]), ("host_cost.py", []),
                                          ("host_cost.py", ["--cold-start"])])
def test_without_a_gpu_one_line_and_exit_1(script, args):
    _one_line(_run(script, *args), 1, f"{script}: needs a GPU")


@pytest.mark.parametrize("script, args, start", [
    ("bench.py", ["--bogus"], "bench.py: unrecognized arguments: --bogus"),
    # bench.py's own checks come before the GPU check: exit 2 here, not 1
    ("bench.py", ["--configs", "runtime", "runtme"], "bench.py: --configs: 'runtme' is none of runtime, untuned"),
    ("bench.py", ["--configs", "ws:abc"], "bench.py: --configs: 'ws:abc': ws:N needs a positive int N"),
    ("bench.py", ["--configs", '{"blockn": 1}'], "bench.py: --configs: '{\"blockn\": 1}' is none of"),
    ("bench.py", ["--configs", '{"block_n": 64.0}'], "bench.py: --configs: '{\"block_n\": 64.0}' is none of"),
    ("bench.py", ["--calls", "0"], "bench.py: --calls: expected an int >= 1, got 0"),
    ("bench.py", ["--filter", "no such case"], "bench.py: --filter ['no such case'] / --exclude []: no case"),
    ("host_cost.py", ["--calls", "0"], "host_cost.py: argument --calls: expected an int >= 1, got 0"),
    ("host_cost.py", ["--cold-start", "--tree", REPO], "host_cost.py: --cold-start times this checkout's first calls; "
                                                       "it takes none of --tree"),
    ("host_cost.py", ["--compare", HOST_JSON, HOST_JSON, "--quick"], "host_cost.py: --compare prints two runs side "
                                                                      "by side; it takes none of --quick"),
    ("host_cost.py", ["--tree", "/nonexistent"], "host_cost.py: --tree: /nonexistent is not a checkout"),
    ("host_cost.py", ["--compare", "/nonexistent.json", HOST_JSON], "host_cost.py: /nonexistent.json: cannot read it"),
    ("report.py", [], "report.py: the following arguments are required: bench_json"),
    ("report.py", ["/nonexistent.json"], "report.py: /nonexistent.json: cannot read it (No such file"),
    ("report.py", [HOST_JSON], f"report.py: {HOST_JSON}: expected a JSON object with 'env', 'rows', missing 'env'"),
    ("plots.py", [BENCH_JSON], "plots.py: the following arguments are required: bench_json"),
])
def test_a_wrong_argument_is_one_line_and_exit_2(script, args, start):
    _one_line(_run(script, *args), 2, start)


def test_a_file_that_is_not_json_is_named(tmp_path):
    (tmp_path / "bench.json").write_text("half a file {")
    _one_line(_run("report.py", tmp_path / "bench.json"), 2, f"report.py: {tmp_path / 'bench.json'}: not a JSON file")


def test_plots_on_a_missing_file_creates_no_folder(tmp_path):
    _one_line(_run("plots.py", tmp_path / "pngs", tmp_path / "missing.json"), 2,
              f"plots.py: {tmp_path / 'missing.json'}: cannot read it")
    assert not (tmp_path / "pngs").exists()


def test_plots_without_matplotlib_say_so_and_create_no_folder(tmp_path):
    _one_line(_run("plots.py", tmp_path / "pngs", BENCH_JSON, hide_matplotlib=True), 1,
              "plots.py: needs matplotlib (pip install matplotlib")
    assert not (tmp_path / "pngs").exists()


def test_report_and_compare_still_read_real_runs():
    report = _run("report.py", BENCH_JSON)
    assert report.returncode == 0 and report.stdout.count("\n| ") > 3, report.stderr
    compare = _run("host_cost.py", "--compare", HOST_JSON, HOST_JSON)
    assert compare.returncode == 0 and compare.stdout.startswith("| call |"), compare.stderr
