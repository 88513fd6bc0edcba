"""What a tuning run is told (TuneSettings), who this worker is, and what finishing a bucket gives."""
from __future__ import annotations

import dataclasses
import os
import socket

from ..configs import LaunchConfig
from .buckets import Bucket
from .worker import DEFAULT_RUNNER

# This worker process, as recorded on every trial and claim it touches.
TUNER_ID = f"{socket.gethostname()}:{os.getpid()}"

BUSY = "busy"  # tune_bucket: the rest of this bucket is in other workers' hands for now; come back later
FINISHED_ELSEWHERE = "finished elsewhere"  # tune_bucket: another worker (or an earlier run) finished it


@dataclasses.dataclass
class TuneSettings:
    storage: str
    trials: int = 40  # evaluated configs per bucket (duplicates not counted)
    patience: int | None = None  # stop a bucket after this many evaluated trials in a row without a better one
    # Per table and path, the first full_search buckets search the whole space; later ones only the
    # default and the `leaders` fastest configs of each of those studies (transfer.py). None: all search.
    full_search: int | None = None
    leaders: int = 4
    bucket_time_s: float = 300.0  # per worker and bucket
    deadline: float | None = None  # time.monotonic() after which no new trial starts
    margin: float = 0.03  # a config replaces the default only when this much faster on confirmation
    tie_tolerance: float = 0.01  # configs within 1% of the best are a tie: the default wins, else the smallest key
    confirm_rounds: int = 3
    trial_timeout_s: float = 180.0
    interpret: bool = False
    precompile_workers: int = 0
    runner: str = DEFAULT_RUNNER
    static_check: bool = False  # compile ahead of time and drop configs over the arch's limits
    seed: int = 0
    heartbeat_s: int = 10
    candidates: list | dict | None = None  # search only these LaunchConfigs (plus the default), or lists by table
    # {(table key, path): [(bucket tokens, LaunchConfig)]}: first trials after the default
    seed_configs: dict | None = None
    gpu_lock: str | None = None  # the run's GPU lock file (gpu_lock.py); None: no lock (the interpreter)
    db_retries: int = 5  # a database call that loses the connection is retried this often ...
    db_retry_s: float = 30.0  # ... with backoff (1, 2, 4, ... s) for at most this long in all

    def request(self, bucket: Bucket, config: LaunchConfig, check: bool = True) -> dict:
        """What a trial worker runs (codegen.tuning.trial.run_trial): the config on the bucket's inputs."""
        return dict(bucket=dataclasses.asdict(bucket), config=config.to_dict(), interpret=self.interpret, check=check,
                    gpu_lock=self.gpu_lock)


@dataclasses.dataclass
class BucketResult:
    bucket: Bucket
    config: LaunchConfig
    is_default: bool
    default_us: float | None
    tuned_us: float | None
    trials: int
    failures: int
    failure_kinds: dict
    study_name: str
    note: str = ""
    elapsed_s: float | None = None  # this worker's wall time on the bucket (all visits, confirmation included)

    @property
    def speedup(self) -> float | None:
        if self.default_us and self.tuned_us:
            return self.default_us / self.tuned_us
        return None
