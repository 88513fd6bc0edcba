"""What a study's trials say: which configs were measured, are running or queued, and how final a
bucket's published result is. Read-only views over Optuna's records, shared by the bucket loop,
the confirmation and `msa-tune status`."""
from __future__ import annotations

import optuna

from ..configs import LaunchConfig
from .space import config_key

_STATES = optuna.trial.TrialState
RESULT = "result"  # study user attr: the published outcome (what went into the JSON, and how final)


def evaluated(trials) -> list:
    """Trials that measured their config: passed, or failed with a recorded reason. (A trial failed
    for a stale heartbeat, i.e. its worker died, was not evaluated: its retry will be.)"""
    return [t for t in trials if t.user_attrs.get("config_key") and not t.user_attrs.get("duplicate")
            and (t.state == _STATES.COMPLETE or (t.state == _STATES.FAIL and "failure" in t.user_attrs))]


def key_of(trial) -> str | None:
    """A trial's config key: recorded when it ran, or read off the params it was queued with."""
    key = trial.user_attrs.get("config_key")
    if key is None:
        fixed = trial.system_attrs.get("fixed_params") or trial.params
        try:
            key = config_key(LaunchConfig(**fixed)) if fixed else None
        except TypeError:
            key = None
    return key


def running(trials) -> list:
    return [t for t in trials if t.state == _STATES.RUNNING and key_of(t) and not t.user_attrs.get("duplicate")]


def waiting_keys(trials) -> set[str]:
    """Configs queued (enqueue_trial) but not yet picked up by any worker."""
    return {key_of(t) for t in trials if t.state == _STATES.WAITING} - {None}


def taken_by_an_earlier_trial(trial, key: str, trials) -> bool:
    """Two workers may queue and pop the same config at once; the lower trial number runs it."""
    for t in trials:
        if t.number >= trial.number or t.user_attrs.get("duplicate") or key_of(t) != key:
            continue
        if t.state in (_STATES.WAITING, _STATES.RUNNING, _STATES.COMPLETE) or "failure" in t.user_attrs:
            return True
    return False


def claimed_keys(trials) -> set[str]:
    """Configs evaluated or being evaluated (by any worker sharing the study): never run twice."""
    return {key_of(t) for t in evaluated(trials) + running(trials)}


def oom_losses(trials, key: str) -> int:
    """Attempts of one config lost to running out of GPU memory (not its verdict: retried)."""
    return sum(1 for t in trials if t.user_attrs.get("lost") == "out_of_memory" and t.user_attrs.get("config_key") == key)


def first_line(message, width: int = 200) -> str:
    """The first line of a failure message, cut to `width` characters: what a log line shows."""
    lines = str(message or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def failure_reason(trial, width: int = 200) -> str:
    """A failed trial's kind and the first line of its message, e.g. "error: ValueError: q: ..."."""
    kind = trial.user_attrs.get("failure", "error")
    message = first_line(trial.user_attrs.get("failure_message"), width)
    return f"{kind}: {message}" if message else kind


def stalled(done, patience: int, tolerance: float) -> bool:
    """Whether the last `patience` evaluated trials (failures included) all came after the best, none
    beating it by more than `tolerance`: the search has stopped finding anything (--patience)."""
    best, since = None, 0
    for t in sorted(done, key=lambda t: t.number):
        if t.state == _STATES.COMPLETE and (best is None or t.value < best * (1 - tolerance)):
            best, since = t.value, 0
        else:
            since += 1
    return best is not None and since >= patience


def is_final(result: dict | None, target: int) -> bool:
    """A published result ends the bucket for a run asking `target` trials, unless that search was
    cut short by a time budget (a later run resumes it) or asked fewer trials than this run."""
    return bool(result) and bool(result.get("complete")) and int(result.get("target", 0)) >= target


def progress(bucket, trials) -> str:
    done = evaluated(trials)
    ok = [t for t in done if t.state == _STATES.COMPLETE]
    best = min((t.value for t in ok), default=None)
    best_text = f"best {best:.2f} us" if best is not None else "no passing config yet"
    return f"  {bucket.label}: {len(done)} trials, {len(done) - len(ok)} failed, {best_text}"
