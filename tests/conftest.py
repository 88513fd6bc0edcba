# Loaded by pytest for every suite under tests/ (before the suite's own conftest). It imports
# nothing heavy: tests/static must still unset TRITON_INTERPRET before anything imports Triton.
#
# In CI (CI=true, as .ci/run sets), a suite whose every test was skipped fails the session: a
# missing dependency or a stray environment variable once turned whole suites (tests/static under
# TRITON_INTERPRET=1, tests/vllm without vLLM) into skips that reported success (issue 39).
# tests/vllm also fails there when vLLM is not importable, even if its vLLM-free modules ran.
import importlib.util
import os

import pytest

# The suites CI runs (scripts/test.sh); tests/gpu needs a GPU and scripts/gpu_check.sh judges it.
CI_SUITES = ("interp", "static", "vllm", "postgres")
RAN = ("passed", "failed", "error", "xfailed", "xpassed")  # the terminal reporter's outcome names
# A suite's own dependency, which CI installs for it. Some of tests/vllm's tests need no vLLM
# (test_checks.py, test_hook.py), so the all-skipped rule alone would let its witness and plugin
# modules skip themselves unnoticed: in CI a session that runs the suite without it fails.
CI_SUITE_NEEDS = {"vllm": "vllm"}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def suite_of(nodeid: str) -> str | None:
    """The suite ("interp", "static", ...) of a test or module id relative to the repository."""
    parts = nodeid.replace("\\", "/").split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else None


def suites_that_only_skipped(stats: dict) -> list[str]:
    """The CI suites with skipped tests (or modules) and not one test that ran, by the terminal
    reporter's outcome lists (`stats`: outcome -> reports)."""
    ran, skipped = set(), set()
    for outcome, reports in stats.items():
        for report in reports:
            suite = suite_of(getattr(report, "nodeid", "") or "")
            if outcome == "skipped":
                skipped.add(suite)
            elif outcome in RAN:
                ran.add(suite)
    return sorted(s for s in skipped - ran if s in CI_SUITES)


def suites_missing_their_dependency(stats: dict) -> list[str]:
    """The suites of CI_SUITE_NEEDS with a test or module in `stats` whose dependency is not importable."""
    seen = {suite_of(getattr(report, "nodeid", "") or "") for reports in stats.values() for report in reports}
    return sorted(suite for suite, module in CI_SUITE_NEEDS.items()
                  if suite in seen and not installed(module))


def installed(module: str) -> bool:
    """Whether `module` imports as an installed package: tests/ on sys.path makes tests/vllm a
    namespace package named vllm, which find_spec finds too (its origin is None)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin not in (None, "namespace")


def pytest_sessionfinish(session, exitstatus):
    if not in_ci() or hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
        return
    if session.exitstatus != pytest.ExitCode.OK:  # failed already (nothing collected is exit 5)
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    silent = suites_that_only_skipped(reporter.stats)
    if silent:
        reporter.write_line(f"CI=true: every test of tests/{', tests/'.join(silent)} was skipped; a suite that runs "
                            f"nothing fails in CI (see the skip reasons above)", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    for suite in suites_missing_their_dependency(reporter.stats):
        reporter.write_line(f"CI=true: tests/{suite} ran without {CI_SUITE_NEEDS[suite]!r} importable; its modules "
                            f"that need it skipped themselves (install it: scripts/test.sh)", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
