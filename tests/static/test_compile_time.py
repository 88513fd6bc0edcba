"""Compile time is a static figure (issue 25): a config whose compile (Triton + ptxas) takes over
codegen.static.COMPILE_SECONDS_LIMIT is a problem the tuner drops, and the GPU suite uses none."""
import pytest

from codegen import gpu_suite, static


def test_a_slow_compile_is_a_problem_and_a_fast_one_is_not():
    fast = {"registers": 100, "shared_bytes": 1024, "spill": 0, "scratch_bytes": 0, "compile_seconds": 2.0}
    assert static.problems_of("sm90", fast) == []
    slow = dict(fast, compile_seconds=static.COMPILE_SECONDS_LIMIT + 0.5)
    (problem,) = static.problems_of("sm90", slow)
    assert problem.startswith("compile time") and f"{static.COMPILE_SECONDS_LIMIT:g} s" in problem


@pytest.mark.parametrize("family", ["prefill", "decode"])
def test_the_gpu_suites_configs_compile_under_the_limit(family):
    """Each config tests/gpu runs, at the model's widest layout (64/4), scalar fp8 (figures cached)."""
    launches = [launch for config in gpu_suite.suite_configs()[family]
                for launch in static.launches_for("sm90", family, "scalar", "fp8", 64, 4, config, source="gpu-suite")]
    reports = static.report_many(launches, jobs=2)
    assert len(reports) >= len(gpu_suite.suite_configs()[family])
    failed = [f"{r.launch_id}: {r.error}" for r in reports if r.error is not None or not r.registers]
    assert not failed, f"did not compile (a failure's compile_seconds is only the time to it): {failed}"
    slow = [f"{r.launch_id}: {r.compile_seconds} s" for r in reports
            if r.compile_seconds is None or r.compile_seconds > static.COMPILE_SECONDS_LIMIT]
    assert not slow, f"over the {static.COMPILE_SECONDS_LIMIT:g} s compile limit: {slow}"
