# Host threads per pytest-xdist worker. Every worker's torch otherwise starts one thread per core:
# 8 workers on 16 cores ran 128 threads for the CPU work between launches (input building, Triton
# compiles), and more workers made the suite slower (issue 25). Set before torch starts its pools.
import os

_WORKERS = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, str(THREADS))


def pytest_configure(config):
    import torch

    torch.set_num_threads(min(THREADS, int(os.environ["OMP_NUM_THREADS"])))
