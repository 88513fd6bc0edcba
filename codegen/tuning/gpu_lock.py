"""One tuning run's GPU, taken in turn: the trial worker holds it for a whole trial (inputs, check,
timing) and the preparers only while they build a bucket's inputs. Their compiles need no GPU
(codegen.static.jit.compiled_not_launched), so they go on while a trial times, and nothing of theirs
runs on the GPU inside a trial's measurement. A file lock (flock) on a path the run hands to every
process: the processes are spawned, so it needs no shared handle."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import uuid


def new_lock_path() -> str:
    """A fresh lock file path for one run; the file appears on first use (remove_lock at the end)."""
    return os.path.join(tempfile.gettempdir(), f"msa-tune-gpu-{os.getpid()}-{uuid.uuid4().hex[:8]}.lock")


def remove_lock(path: str | None) -> None:
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def held(path: str | None):
    """Holds the run's GPU for the block; no-op without a path (the interpreter, or a single process)."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
