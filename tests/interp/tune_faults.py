"""Trial runners for the tuner tests: the real trial, with chosen configs made to misbehave.

Imported by the spawned trial workers (pytest puts this folder on sys.path, which spawn inherits).
The config field that selects the fault is block_n, so every fault is one point of the space.
"""
import os
import time

from codegen.tuning import trial


def faulty(request: dict) -> dict:
    c = request["config"]
    if (c["block_n"], c["num_warps"], c["num_stages"]) == (32, 8, 1):
        raise RuntimeError("injected: this config raises")
    if (c["block_n"], c["num_warps"], c["num_stages"]) == (32, 8, 2):
        time.sleep(3600)  # hangs: the orchestrator's timeout must end it
    if (c["block_n"], c["num_warps"]) == (128, 8):
        os._exit(3)  # the process dies (as after an illegal address)
    if (c["block_n"], c["num_warps"]) == (128, 4):
        return _garbage(request)
    return trial.run_trial(request)


def oom_once(request: dict) -> dict:
    """The real trial, except that one config's first attempt runs out of GPU memory (as when other
    processes hold the device's memory): the tuner must retry it, not record it as the config's failure."""
    c = request["config"]
    marker = os.path.join(os.environ["TUNE_TEST_MARKERS"], "oom-{block_n}-{num_warps}".format(**c))
    if (c["block_n"], c["num_warps"]) != (64, 2) or os.path.exists(marker):
        return trial.run_trial(request)
    open(marker, "w").close()
    original = trial.bucket_inputs

    def out_of_memory(*args, **kwargs):  # where the H200 run hit it: allocating the bucket's inputs
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.68 GiB (injected)")

    trial.bucket_inputs = out_of_memory
    try:
        return trial.run_trial(request)
    finally:
        trial.bucket_inputs = original


def oom_always(request: dict) -> dict:
    """Every attempt of every config runs out of GPU memory (as when preparers held it all: H200,
    decode 64x4@512, 2026-12-03)."""
    return {"ok": False, "kind": "out_of_memory", "message": "CUDA out of memory (injected)"}


def _garbage(request: dict) -> dict:
    """The real trial, but the kernel's output is overwritten with plausible nonsense."""
    original = trial.run_kernel

    def wrong(case, **kw):
        out = original(case, **kw)
        return out.mul_(0.5)

    trial.run_kernel = wrong
    try:
        return trial.run_trial(request)
    finally:
        trial.run_kernel = original


def slow(request: dict) -> dict:
    """The real trial plus a delay, so a test can kill the tuner mid-study."""
    time.sleep(float(os.environ.get("TUNE_TEST_DELAY", "0.3")))
    return trial.run_trial(request)


def slower_than_the_default(request: dict) -> dict:
    """No kernel: the default config (block_n 64, 4 warps) times 100 us, every other config more,
    so a search can never beat its first trial (for --patience)."""
    c = request["config"]
    slower = 0 if (c["block_n"], c["num_warps"]) == (64, 4) else c["block_n"] + c["num_warps"]
    t = 100.0 + slower
    return dict(ok=True, time_us=t, p10_us=t, p90_us=t, calls=1, replays=1, rel_l2=0.0, max_abs=0.0)


def timed_by_config(request: dict) -> dict:
    """No kernel: a time that is a fixed function of the config (distinct for most configs), so a
    test knows which configs a study ranks first."""
    c = request["config"]
    t = 100.0 + c["block_n"] / 8 + 3 * c["num_warps"] + 7 * c["num_stages"] + 11 * c["num_splits"] + c["kv_upcast"]
    return dict(ok=True, time_us=t, p10_us=t, p90_us=t, calls=1, replays=1, rel_l2=0.0, max_abs=0.0)


def candidate_at_fraction(request: dict) -> dict:
    """No kernel: the bucket's default config times 100 us, every other config 100 us times
    TUNE_TEST_FRACTION, in the search and in the confirmation alike (for the confirmation margin)."""
    from codegen.configs import LaunchConfig
    from codegen.tuning.buckets import Bucket
    from codegen.tuning.space import config_key, default_for

    default = default_for(Bucket(**request["bucket"]))
    is_default = config_key(LaunchConfig.from_dict(request["config"])) == config_key(default)
    t = 100.0 if is_default else 100.0 * float(os.environ["TUNE_TEST_FRACTION"])
    return dict(ok=True, time_us=t, p10_us=t, p90_us=t, calls=1, replays=1, rel_l2=0.0, max_abs=0.0)
