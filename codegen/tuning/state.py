"""What one worker process carries across buckets: the study database, its open studies, the
claims it has seen, and the counts and phase times it reports at the end."""
from __future__ import annotations

import time

from .heartbeats import Heartbeats
from .settings import TUNER_ID, TuneSettings
from .storage import DbRetry, open_storage


class TunerState:
    def __init__(self, settings: TuneSettings, storage=None, log=print):
        self.settings = settings
        self.retry = DbRetry(settings.storage, settings.db_retries, settings.db_retry_s)
        self.storage = storage or open_storage(settings.storage, settings.heartbeat_s, self.retry)
        self.heartbeats = Heartbeats(self.storage, settings.heartbeat_s)
        self.log = log
        self.studies: dict[str, tuple] = {}
        self.bucket_start: dict[str, float] = {}
        self.bucket_s: dict[str, float] = {}  # study name -> this worker's wall seconds on it
        self.claims_seen: dict[int, tuple[str, float]] = {}  # study id -> (claim value, first seen)
        self.busy_said: set[str] = set()
        self.trials_run = 0  # trials this worker ran to a recorded outcome (what the database counts)
        self.confirmations = 0
        self.finished: list[str] = []  # studies this worker finished and published
        self.finished_elsewhere: list[str] = []
        # Wall seconds by phase, for the report: where tuning time goes.
        self.phase_s = {"prepare": 0.0, "trials": 0.0, "confirm": 0.0}
        # The trials' share, split by what the trial worker reported (trial.PHASES); the rest of a
        # trial's wall time is the worker process: requests, results, restarts.
        self.trial_phase_s: dict[str, float] = {}
        self.started = time.monotonic()

    def timed(self, phase: str, fn, *args, **kwargs):
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.phase_s[phase] += time.monotonic() - start

    def count_trial(self, result: dict) -> None:
        """Adds a trial result's phase times (trial.run_trial's "phases") to the account."""
        phases = result.get("phases") or {}
        for name, seconds in phases.items():
            self.trial_phase_s[name] = self.trial_phase_s.get(name, 0.0) + seconds

    def db(self, fn, *args, **kwargs):
        return self.retry.call(fn, *args, **kwargs)

    def close(self):
        self.heartbeats.close()

    def report(self) -> str:
        total = time.monotonic() - self.started
        rest = total - sum(self.phase_s.values())
        return (f"msa-tune: worker {TUNER_ID} ran {self.trials_run} trials and {self.confirmations} confirmations; "
                f"finished {len(self.finished)} buckets here, {len(self.finished_elsewhere)} were finished by "
                f"other workers or earlier runs\n"
                f"msa-tune: {total:.0f} s = static checks and compiles {self.phase_s['prepare']:.0f} s + trials "
                f"{self.phase_s['trials']:.0f} s + confirmations {self.phase_s['confirm']:.0f} s + search, "
                f"database and waiting {rest:.0f} s"
                + (f"\nmsa-tune: trials {self.phase_s['trials']:.0f} s = " + " + ".join(
                    f"{name} {seconds:.0f} s" for name, seconds in self._trial_split().items())
                   if self.trial_phase_s else ""))

    def _trial_split(self) -> dict:
        """The trials' wall time by phase, with what the phases do not cover as "worker process"."""
        split = {_PHASE_NAMES.get(k, k): v for k, v in self.trial_phase_s.items()}
        split["worker process"] = max(0.0, self.phase_s["trials"] - sum(self.trial_phase_s.values()))
        return split


_PHASE_NAMES = {"inputs": "inputs and reference", "check": "first launch and accuracy check",
                "timing": "eager runs and graph capture", "replays": "graph replays"}
