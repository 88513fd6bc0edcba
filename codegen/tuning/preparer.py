"""Before a batch of candidates gets GPU time: the static resource check (an ahead-of-time compile
against the arch's limits) and the JIT compile, both in parallel processes on the host's cores."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import time


class Preparer:
    def __init__(self, workers: int, static: bool, precompile: bool):
        self.workers, self.static, self.precompile = workers, static, precompile
        self._pool = None
        self.candidates = 0
        self.phase_s: dict[str, float] = {}  # summed over the processes (trial.prepare's phases)
        # Batches wait for their slowest candidate: wall seconds of the batches, and of those slowest.
        self.batches, self.batch_s, self.slowest_s = 0, 0.0, 0.0

    def __call__(self, requests: list[dict]) -> list[list[str]]:
        """Static problems per request (empty: fit to run)."""
        if not requests or not (self.static or self.precompile):
            return [[] for _ in requests]
        from .trial import prepare_timed

        jobs = [dict(r, static=self.static, precompile=self.precompile) for r in requests]
        self._started = time.monotonic()
        if self.workers <= 1:
            return self._count([prepare_timed(job) for job in jobs])
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        try:
            return self._count(list(self._pool.map(prepare_timed, jobs)))
        except cf.process.BrokenProcessPool:
            # A candidate killed a compile process, which fails the whole batch's futures: failing
            # them all would condemn the innocent ones, so each runs in its isolated trial, which
            # records the culprit's crash.
            self._pool = None
            return [[] for _ in requests]

    def _count(self, outcomes) -> list[list[str]]:
        self.batches += 1
        self.batch_s += time.monotonic() - self._started
        self.slowest_s += max((sum(phases.values()) for _, phases in outcomes), default=0.0)
        for _, phases in outcomes:
            self.candidates += 1
            for name, seconds in phases.items():
                self.phase_s[name] = self.phase_s.get(name, 0.0) + seconds
        return [problems for problems, _ in outcomes]

    def account(self) -> str:
        """Where the preparer processes' time went, summed over them (they run in parallel)."""
        parts = " + ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phase_s.items())
        return (f"msa-tune: {self.candidates} candidates prepared in {max(1, self.workers)} processes: "
                f"{parts or 'nothing'}; {self.batches} batches took {self.batch_s:.0f} s, their slowest "
                f"candidates {self.slowest_s:.0f} s")

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
