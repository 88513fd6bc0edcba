"""Before a candidate gets GPU time: the static resource check and the JIT compile
(trial.prepare), in parallel processes on the host's cores. Candidates are submitted one by one and
collected as they finish, so that a slow compile holds up only its own candidate: the study keeps
the processes busy with the next ones meanwhile (study.py)."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp


class Preparer:
    def __init__(self, workers: int, static: bool, precompile: bool):
        self.workers, self.static, self.precompile = workers, static, precompile
        self._pool = None
        self.candidates = 0
        self.phase_s: dict[str, float] = {}  # summed over the processes (trial.prepare's phases)

    def submit(self, request: dict) -> cf.Future:
        """Starts preparing one candidate; `result` of the future gives its static problems."""
        from .trial import prepare_timed

        future = cf.Future()
        if not (self.static or self.precompile):
            future.set_result(([], {}))
            return future
        job = dict(request, static=self.static, precompile=self.precompile)
        if self.workers <= 1:
            future.set_result(prepare_timed(job))
            return future
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        try:
            return self._pool.submit(prepare_timed, job)
        except cf.process.BrokenProcessPool:
            self._pool = None
            future.set_result(([], {}))
            return future

    @staticmethod
    def first_done(futures) -> list[cf.Future]:
        """Waits until at least one of `futures` is done; returns the done ones."""
        done, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
        return list(done)

    def result(self, future: cf.Future) -> list[str]:
        """A finished candidate's static problems (empty: fit to run)."""
        try:
            problems, phases = future.result()
        except cf.process.BrokenProcessPool:
            # A candidate killed a compile process, which fails every candidate the pool held:
            # failing them all would condemn the innocent ones, so each runs in its isolated trial,
            # which records the culprit's crash.
            self._pool = None
            return []
        if self.static or self.precompile:
            self.candidates += 1
        for name, seconds in phases.items():
            self.phase_s[name] = self.phase_s.get(name, 0.0) + seconds
        return problems

    def __call__(self, requests: list[dict]) -> list[list[str]]:
        """Static problems per request, all prepared at once."""
        futures = [self.submit(r) for r in requests]
        return [self.result(f) for f in futures]

    def account(self) -> str:
        """Where the preparer processes' time went, summed over them (they run in parallel)."""
        parts = " + ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phase_s.items())
        return f"msa-tune: {self.candidates} candidates prepared in {max(1, self.workers)} processes: {parts or 'nothing'}"

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
