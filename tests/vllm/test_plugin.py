"""The vLLM plugin (codegen/vllm_plugin.py) as vLLM 0.33.0 loads it: found through its entry point by
vllm.plugins.load_general_plugins(), every MiniMax-M3 module holding the two functions patched,
prefill and decode through vLLM's module path matching the reference (Triton interpreter), a cache
it does not serve left to vLLM's kernel, and nothing patched when turned off.

Runs in .venv-vllm (scripts/setup_vllm.sh). Each scenario runs in its own interpreter
(scenarios.py); all of them start together, as they spend their time importing vLLM.
"""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

if importlib.util.find_spec("vllm") is None:  # find_spec: importing vLLM here would cost seconds
    pytest.skip("vLLM is installed in .venv-vllm only (scripts/setup_vllm.sh)", allow_module_level=True)

SCENARIOS = pathlib.Path(__file__).with_name("scenarios.py")
ROOT = SCENARIOS.parents[2]
ENV = {"on": {}, "preloaded": {}, "off": {"MSA_TUNE_VLLM": "0"}}


@pytest.fixture(scope="module")
def started():
    procs = {}
    for name, extra in ENV.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MSA_TUNE_VLLM", "VLLM_"))}
        env.update(TRITON_INTERPRET="1", MSA_TUNE_VLLM_ARCH="sm90", OMP_NUM_THREADS="1", **extra)
        procs[name] = subprocess.Popen([sys.executable, str(SCENARIOS), name], cwd=ROOT, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finish(started, name: str) -> str:
    out, _ = started[name].communicate(timeout=600)
    assert started[name].returncode == 0 and f"PASS {name}" in out, f"scenario {name} failed:\n{out}"
    return out


def test_loaded_by_vllm_routes_every_holder_and_matches_reference(started):
    print(finish(started, "on"))


def test_modules_imported_before_the_plugin_are_patched(started):
    finish(started, "preloaded")


def test_turned_off_leaves_vllm_functions(started):
    finish(started, "off")
