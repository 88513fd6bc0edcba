"""tests/gpu/conftest.py gives each xdist worker cores // workers host threads (issue 25: every
worker using all cores made more workers slower). Checked in a fresh process, as a worker starts."""
import pathlib
import subprocess
import sys

CONFTEST = pathlib.Path(__file__).resolve().parents[1] / "gpu" / "conftest.py"


def _worker(workers: str, omp: str | None = None) -> list[str]:
    code = ("import os, runpy, torch; g = runpy.run_path(%r); g['pytest_configure'](None); "
            "print(g['THREADS'], os.environ['OMP_NUM_THREADS'], torch.get_num_threads(), os.cpu_count())" % str(CONFTEST))
    env = {"PYTEST_XDIST_WORKER_COUNT": workers, "PATH": "/usr/bin:/bin"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                          timeout=120).stdout.split()


def test_each_worker_gets_its_share_of_the_cores():
    threads, omp, torch_threads, cores = map(int, _worker("4"))
    assert threads == max(1, cores // 4) == omp == torch_threads


def test_threads_per_worker():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("gpu_conftest", CONFTEST)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.threads_per_worker(16, "8") == 2
    assert module.threads_per_worker(16, "12") == 1
    assert module.threads_per_worker(16, None) == 16
    assert module.threads_per_worker(2, "16") == 1
    assert module.threads_per_worker(None, "junk") == 1
