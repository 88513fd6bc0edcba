"""scripts/gpu_check.sh without a GPU: argument handling, the summary line, the exit status and the
log, with each part's command replaced through GPU_CHECK_CMD_<PART>."""
import os
import pathlib
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def _run(tmp_path, *args, **commands):
    env = dict(os.environ, PYTHON="python3", **{f"GPU_CHECK_CMD_{k.upper()}": v for k, v in commands.items()})
    log = tmp_path / "check.log"
    proc = subprocess.run(["bash", str(SCRIPT), "--log", str(log), *args], capture_output=True, text=True, env=env,
                          timeout=120)
    return proc, log


def test_dry_run_lists_every_part_and_ends_with_one_summary_line(tmp_path):
    proc, log = _run(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [ln for ln in lines if ln.startswith("gpu_check: DRY-RUN")] == [lines[-1]]
    for part in ("tests", "fuzz", "tune", "bench", "host_cost"):
        assert f" {part} " in lines[-1] + " "
    assert "tests.fuzz.run --seconds 150" in proc.stdout
    assert "--durations=25" in proc.stdout and "--storage sqlite:///" in proc.stdout
    assert "tuned_configs" not in proc.stdout  # the tune part writes to a temp folder only
    assert log.read_text().strip().splitlines()[-1] == lines[-1]


def test_a_failing_part_fails_the_check_and_says_which(tmp_path):
    proc, log = _run(tmp_path, "--only", "tests,bench", tests='echo "== 5 passed, 2 failed in 1.0s =="; exit 1',
                     bench="true")
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check: FAILED tests ") and "(5 passed, 2 failed) FAILED (rc 1)" in last
    assert "| bench " in last and "tune" not in last
    assert "5 passed, 2 failed" in log.read_text()


def test_the_fuzz_part_reports_its_cases_and_fails_on_a_failed_case(tmp_path):
    summary = "tests.fuzz.run: 612 cases (300 decode, 312 prefill), 1 failed, worst passing row rel L2 9e-03, 160 s"
    proc, _ = _run(tmp_path, "--only", "fuzz", fuzz=f'echo "{summary}"; exit 1')
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and "fuzz" in last and "(612 cases, 1 failed) FAILED (rc 1)" in last


@pytest.mark.parametrize("printed", ["404 skipped in 6.0s", "no tests ran in 0.5s"])
def test_gpu_tests_that_all_skipped_or_never_ran_fail_the_check(tmp_path, printed):
    """Issue 39: on a machine without a GPU, pytest skips every GPU test and exits 0."""
    proc, _ = _run(tmp_path, "--only", "tests", tests=f'echo "{printed}"; exit 0')
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("gpu_check: FAILED tests ") and "no GPU test passed" in last


def test_passing_parts_pass(tmp_path):
    proc, _ = _run(tmp_path, "--only", "tune,bench", tune="true", bench="true")
    assert proc.returncode == 0
    assert proc.stdout.strip().splitlines()[-1].startswith("gpu_check: PASSED tune ")


@pytest.mark.parametrize("args,message", [(["--only", "tests,nope"], "unknown part 'nope'"),
                                          (["-n", "0"], "positive number of workers"),
                                          (["--frobnicate"], "unknown argument"),
                                          (["--log"], "--log needs a path")])
def test_bad_arguments_are_refused_clearly(tmp_path, args, message):
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_the_header_names_the_sources_fingerprint(tmp_path):
    """The log's first line carries the fingerprint `--fingerprint` prints: the sha256 of each source
    file's path and content in path order, so a log from a copy of the tree without its git history
    still names what ran. A changed source changes it."""
    import hashlib

    root = SCRIPT.parents[1]
    printed = subprocess.run(["bash", str(SCRIPT), "--fingerprint"], capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and len(printed.stdout.strip()) == 16
    files = sorted((p.relative_to(root).as_posix() for top in ("codegen", "templates", "tuned_configs", "tests",
                                                                "scripts", "benchmarks", "tune.py")
                    for p in ([root / top] if (root / top).is_file() else (root / top).rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"),
                   key=lambda name: name.encode())
    lines = "".join(f"{hashlib.sha256((root / f).read_bytes()).hexdigest()}  {f}\n" for f in files)
    assert printed.stdout.strip() == hashlib.sha256(lines.encode()).hexdigest()[:16]
    proc, log = _run(tmp_path, "--dry-run")
    assert f"(sources {printed.stdout.strip()})" in log.read_text().splitlines()[0]


def test_cores_ignore_omp_num_threads(tmp_path, monkeypatch):
    """GNU nproc honours OMP_NUM_THREADS; scripts/h200.sh sets it to 2, and the check then sized its
    test workers for 2 cores on a 16-core machine. The header (and -n) count the cores this process may
    use, with OMP_NUM_THREADS=1 set or not."""
    usable = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    proc, log = _run(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f", {usable} cores, parts:" in log.read_text().splitlines()[0]
