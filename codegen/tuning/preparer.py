"""Before a batch of candidates gets GPU time: the static resource check (an ahead-of-time compile
against the arch's limits) and the JIT compile, both in parallel processes on the host's cores."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp


class Preparer:
    def __init__(self, workers: int, static: bool, precompile: bool):
        self.workers, self.static, self.precompile = workers, static, precompile
        self._pool = None

    def __call__(self, requests: list[dict]) -> list[list[str]]:
        """Static problems per request (empty: fit to run)."""
        if not requests or not (self.static or self.precompile):
            return [[] for _ in requests]
        from .trial import prepare

        jobs = [dict(r, static=self.static, precompile=self.precompile) for r in requests]
        if self.workers <= 1:
            return [prepare(job) for job in jobs]
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        try:
            return list(self._pool.map(prepare, jobs))
        except cf.process.BrokenProcessPool:
            # A candidate killed a compile process, which fails the whole batch's futures: failing
            # them all would condemn the innocent ones, so each runs in its isolated trial, which
            # records the culprit's crash.
            self._pool = None
            return [[] for _ in requests]

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
