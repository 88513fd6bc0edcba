"""Finishing a bucket: pick the fastest config, confirm it against the default by alternating
runs, keep it only for a real gain, publish it, and record the outcome in the study."""
from __future__ import annotations

import datetime
import statistics

import optuna

from ..configs import LaunchConfig
from .buckets import Bucket
from .records import RESULT, evaluated
from .settings import BUSY, TUNER_ID, BucketResult
from .space import config_key, default_for


def pick(bucket: Bucket, completed, tie_tolerance: float):
    """Fastest config; within `tie_tolerance` of it the default wins, else the smallest config key."""
    best = min(t.value for t in completed)
    ties = [t for t in completed if t.value <= best * (1 + tie_tolerance)]
    default_key = config_key(default_for(bucket))
    for t in ties:
        if t.user_attrs["config_key"] == default_key:
            return t
    return min(ties, key=lambda t: (t.user_attrs["config_key"]))


def confirm(bucket, candidate: LaunchConfig, default: LaunchConfig, settings, worker) -> tuple[float, float] | None:
    """Median times of default and candidate, measured alternately (so drift hits both alike)."""
    times = {"default": [], "candidate": []}
    for _ in range(settings.confirm_rounds):
        for name, config in (("default", default), ("candidate", candidate)):
            result = worker.run(settings.request(bucket, config, check=False), settings.trial_timeout_s)
            if not result.get("ok"):
                return None
            times[name].append(result["time_us"])
    return statistics.median(times["default"]), statistics.median(times["candidate"])


def finish_claimed(bucket, study, study_name, settings, worker, log, state, claim, publish, *, complete, target):
    """Under this worker's finish claim: confirm, publish (the JSON), record the result, release.
    Returns the BucketResult, or BUSY when another worker took the claim over meanwhile."""
    try:
        try:
            result = finish(bucket, study, study_name, settings, worker, log, state)
        finally:
            claim.stop()
        if not state.db(claim.beat):  # taken over while we looked dead: the new holder publishes
            log(f"  {bucket.label}: another worker took over finishing it")
            return BUSY
        record = publish(result) if publish else {}
        done = len(evaluated(study.get_trials(deepcopy=False)))
        study.set_user_attr(RESULT, dict(record or {}, complete=complete, target=target, evaluated=done,
                                         tuner=TUNER_ID, config=result.config.to_dict(), is_default=result.is_default,
                                         default_us=result.default_us, tuned_us=result.tuned_us, note=result.note,
                                         finished_at=datetime.datetime.now(datetime.timezone.utc)
                                         .isoformat(timespec="seconds")))
    except BaseException:  # this worker stops here: the bucket goes back to whoever comes next
        claim.release()
        raise
    state.db(claim.beat, done=True)
    state.finished.append(study_name)
    return result


def finish(bucket, study, study_name, settings, worker, log, state=None) -> BucketResult:
    trials = study.get_trials(deepcopy=False)
    done = evaluated(trials)
    failed = [t for t in done if t.state == optuna.trial.TrialState.FAIL]
    kinds: dict[str, int] = {}
    for t in failed:
        kinds[t.user_attrs.get("failure", "error")] = kinds.get(t.user_attrs.get("failure", "error"), 0) + 1
    completed = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    default = default_for(bucket)
    common = dict(bucket=bucket, trials=len(done), failures=len(failed), failure_kinds=kinds, study_name=study_name)
    if not completed:
        note = "no config passed; the default stays"
        if failed and set(kinds) == {"out_of_memory"}:  # says nothing about the configs: say so
            note = ("every trial ran out of GPU memory, so no config was measured; the default stays "
                    "(re-tune the bucket with fewer --precompile-workers)")
        return BucketResult(config=default, is_default=True, default_us=None, tuned_us=None, note=note, **common)
    best = pick(bucket, completed, settings.tie_tolerance)
    candidate = LaunchConfig.from_dict(best.user_attrs["config"])
    if config_key(candidate) == config_key(default):
        return BucketResult(config=default, is_default=True, default_us=best.value, tuned_us=best.value,
                            note="the default is the fastest", **common)
    # A finished study confirms once; re-running it (or a worker taking over from one that died
    # after confirming) reuses the stored confirmation.
    stored = study.user_attrs.get("confirmation")
    if stored and stored.get("candidate") == config_key(candidate):
        default_us, tuned_us = stored["default_us"], stored["tuned_us"]
    else:
        changed = {k: v for k, v in candidate.to_dict().items() if default.to_dict().get(k) != v}
        log(f"  {bucket.label}: confirming {changed} against the default")
        confirmed = (state.timed("confirm", confirm, bucket, candidate, default, settings, worker) if state is not None
                     else confirm(bucket, candidate, default, settings, worker))
        if state is not None:
            state.confirmations += 1
        if confirmed is None:
            return BucketResult(config=default, is_default=True, default_us=None, tuned_us=None,
                                note="confirmation run failed; the default stays", **common)
        default_us, tuned_us = confirmed
        study.set_user_attr("confirmation", dict(candidate=config_key(candidate), default_us=default_us,
                                                 tuned_us=tuned_us))
    if tuned_us * (1 + settings.margin) > default_us:
        return BucketResult(config=default, is_default=True, default_us=default_us, tuned_us=default_us,
                            note=f"best {tuned_us:.2f} us is within {settings.margin:.0%} of the default", **common)
    return BucketResult(config=candidate, is_default=False, default_us=default_us, tuned_us=tuned_us, **common)
