"""Trial isolation: candidates run in a child process that is restarted after a crash or a hang.

A config that faults (illegal address), hangs or kills its process ends that trial with its reason
recorded; the study goes on with a fresh worker.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import time

DEFAULT_RUNNER = "codegen.tuning.trial:run_trial"


def _resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _child_main(conn, runner_path: str, env: dict) -> None:
    os.environ.update(env)  # before anything imports triton: TRITON_INTERPRET is read at import
    runner = _resolve(runner_path)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        try:
            result = runner(request)
        except Exception as exc:  # noqa: BLE001 - a raising candidate is a recorded failure, not a dead worker
            result = dict(ok=False, kind="error", message=f"{type(exc).__name__}: {exc}"[:2000])
        conn.send(result)
        if result.get("fatal"):
            return  # e.g. an illegal address poisons the CUDA context: start afresh


class TrialWorker:
    """One child process running `runner` (a "module:function" path) on each request."""

    def __init__(self, runner: str = DEFAULT_RUNNER, env: dict | None = None):
        self.runner = runner
        self.env = dict(env or {})
        self.restarts = 0
        self._ctx = mp.get_context("spawn")  # no CUDA state inherited from the parent
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child_main, args=(child, self.runner, self.env), daemon=True)
        self._proc.start()
        child.close()

    def _restart(self) -> None:
        self.close(kill=True)
        self.restarts += 1
        self._start()

    def run(self, request: dict, timeout_s: float) -> dict:
        """The runner's result, or {"ok": False, "kind": "timeout" | "crash", ...} after a restart."""
        started = time.monotonic()
        try:
            self._conn.send(request)
            if not self._conn.poll(timeout_s):
                self._restart()
                return dict(ok=False, kind="timeout", message=f"no result within {timeout_s:.0f} s; worker restarted")
            result = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            self._restart()
            return dict(ok=False, kind="crash", message=f"worker process died (exit code {code}); restarted")
        if result.get("fatal"):
            self._restart()
        result.setdefault("wall_s", time.monotonic() - started)
        return result

    def close(self, kill: bool = False) -> None:
        if self._proc.is_alive() and not kill:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
