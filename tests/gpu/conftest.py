# Host threads per pytest-xdist worker. Every worker's torch otherwise starts one thread per core:
# 8 workers on 16 cores ran 128 threads for the CPU work between launches (input building, Triton
# compiles), and more workers made the suite slower (issue 25). Set before torch starts its pools.
import os


def threads_per_worker(cores, workers) -> int:
    """cores // workers, at least 1 (workers: PYTEST_XDIST_WORKER_COUNT, unset outside xdist)."""
    try:
        workers = max(1, int(workers or 1))
    except ValueError:
        workers = 1
    return max(1, (cores or 1) // workers)


THREADS = threads_per_worker(os.cpu_count(), os.environ.get("PYTEST_XDIST_WORKER_COUNT"))
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, str(THREADS))


def pytest_configure(config):
    import torch

    torch.set_num_threads(THREADS)
