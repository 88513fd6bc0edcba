"""One bucket's study, worked until it is finished or the rest is in other workers' hands:
ask for configs, skip those measured or claimed elsewhere, prepare and run the rest in the isolated
trial worker, record each outcome; then finish the bucket under its claim (confirm.py).

Any number of workers (one process per GPU, on one host or many) can share the studies of one run
through one database: every bucket's study is worked by whichever worker is free (ask/tell, with
claims so that no config runs twice), a worker moves on when the rest of a bucket is being measured
by others, and exactly one worker, the one that wins the bucket's finish claim, runs the
confirmation and publishes the result. A worker killed mid-trial stops beating; its trial is failed
by heartbeat and retried by whoever is free. A worker that loses the database retries with backoff
(`DbRetry`), then stops with StorageUnavailable, leaving everything recorded so far in place.
"""
from __future__ import annotations

import time
import warnings

import optuna

from . import records
from .buckets import Bucket
from .claims import try_claim
from .confirm import finish_claimed
from .heartbeats import fail_orphans
from .preparer import Preparer
from .records import RESULT
from .seeding import open_study
from .settings import BUSY, FINISHED_ELSEWHERE, TUNER_ID, BucketResult, TuneSettings
from .space import bucket_ws_gqa, config_key, params_of, suggest
from .state import TunerState
from .storage import StorageUnavailable
from .worker import TrialWorker

optuna.logging.set_verbosity(optuna.logging.WARNING)
# We drive studies with ask/tell and record heartbeats ourselves (heartbeats.py), which Optuna flags
# as experimental; the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")

_OOM_RETRIES = 2  # attempts of one config lost to out-of-memory before it counts as its failure


def tune_bucket(bucket: Bucket, study_name: str, settings: TuneSettings, worker: TrialWorker,
                preparer: Preparer, log=print, state: TunerState | None = None, publish=None, neighbours=None,
                leaders=None):
    """Works on one bucket's study until it is finished or the rest of it is in other workers' hands.

    Returns the BucketResult when this worker finished the bucket (confirmation run, then
    `publish(result)`, whose JSON-able return value is stored in the study as its "result"), BUSY
    when others are measuring what is left (or finishing it), FINISHED_ELSEWHERE when it was
    already finished. Raises StorageUnavailable when the database stays unreachable.
    `neighbours`: a function returning the configs chosen for nearby buckets of the same table,
    queued after the default; called once, when the study is seeded. `leaders`: see
    seeding.open_study (BUSY while the studies it needs are unfinished)."""
    own_state = state is None
    if own_state:
        state = TunerState(settings, log=log)
    start = time.monotonic()
    try:
        outcome = _tune_bucket(bucket, study_name, settings, worker, preparer, log, state, publish, neighbours, leaders)
        state.bucket_s[study_name] = state.bucket_s.get(study_name, 0.0) + time.monotonic() - start
        if isinstance(outcome, BucketResult):
            outcome.elapsed_s = state.bucket_s[study_name]
        return outcome
    finally:
        if own_state:
            state.close()


def _tune_bucket(bucket, study_name, settings, worker, preparer, log, state, publish, neighbours=None, leaders=None):
    opened = open_study(bucket, study_name, settings, state, neighbours, leaders)
    if opened is None:
        return _busy(bucket, study_name, state, log, "waiting for its table's full searches (--full-search)")
    study, space, exhaustive = opened
    budget_end = state.bucket_start.setdefault(study_name, time.monotonic()) + settings.bucket_time_s
    target = min(settings.trials, len(space))
    batch = max(1, settings.precompile_workers) if not settings.interpret else 1
    space_keys = {config_key(c): c for c in space}
    duplicates_in_a_row = 0
    # Candidates of this worker being prepared (future -> (trial, config)). Up to `batch` at once; as
    # each finishes its trial runs and the next is asked for, so a slow compile holds up only itself.
    inflight: dict = {}
    while True:
        optuna.storages.fail_stale_trials(study)  # trials of dead workers: failed, retried once
        if not inflight and records.is_final(study.user_attrs.get(RESULT), target):
            state.finished_elsewhere.append(study_name)
            return FINISHED_ELSEWHERE
        trials = study.get_trials(deepcopy=False)
        fail_orphans(study, trials, state.storage, state.db)
        mine = {trial._trial_id for trial, _ in inflight.values()}
        done = records.evaluated(trials)
        running = [t for t in records.running(trials) if t._trial_id not in mine]  # other workers'
        known = records.claimed_keys(trials)
        unclaimed = [k for k in space_keys if k not in known] if exhaustive else None
        now = time.monotonic()
        cut_short = bool(settings.deadline and now > settings.deadline)
        search_over = (len(done) >= target or now > budget_end or cut_short or duplicates_in_a_row > 200
                       or (exhaustive and not unclaimed)
                       or bool(settings.patience and records.stalled(done, settings.patience, settings.tie_tolerance)))
        if search_over and not inflight:
            if running:  # wait for them (or for their heartbeat to go stale) elsewhere
                return _busy(bucket, study_name, state, log, f"{len(running)} trials still running elsewhere")
            claim = try_claim(state, study._study_id, TUNER_ID)
            if claim is None:
                return _busy(bucket, study_name, state, log, "another worker is confirming it")
            return finish_claimed(bucket, study, study_name, settings, worker, log, state, claim, publish,
                                  complete=not cut_short, target=target)
        room = target - len(done) - len(running) - len(inflight)
        if exhaustive and not search_over:
            # Queue-driven: every unclaimed point gets exactly one trial, whichever worker pops it.
            waiting = records.waiting_keys(trials)
            for key in unclaimed[:batch]:
                if key not in waiting:
                    study.enqueue_trial(_params(bucket, space_keys[key]))
            room = min(room, len(unclaimed))
        if room <= 0 and not inflight:  # the rest is being measured by other workers
            return _busy(bucket, study_name, state, log, f"the last {len(running)} trials are running elsewhere")
        if not search_over and room > 0 and len(inflight) < batch:
            state.busy_said.discard(study_name)
            asked, duplicates = _ask(study, bucket, state, min(batch - len(inflight), room), known, space_keys,
                                     exhaustive)
            duplicates_in_a_row = duplicates_in_a_row + duplicates if not asked else 0
            for trial, config in asked:
                inflight[preparer.submit(settings.request(bucket, config))] = (trial, config)
            if not inflight:
                continue
        for future in state.timed("prepare", preparer.first_done, list(inflight)):
            trial, config = inflight.pop(future)
            found = preparer.result(future)
            if found:
                _tell(study, trial, state, failure=("static", "; ".join(found)), log=log, bucket=bucket)
                continue
            _run_trial(bucket, study, trial, config, settings, worker, state, log)
        if not inflight:
            log(records.progress(bucket, study.get_trials(deepcopy=False)))


def _ask(study, bucket, state, count: int, known: set, space_keys: dict, exhaustive: bool) -> tuple[list, int]:
    """Up to `count` new (trial, config) pairs from the study, and how many asks were duplicates: a
    config measured, running or queued before (here or by another worker) is told PRUNED at once."""
    asked, duplicates = [], 0
    for _ in range(count):
        trial = study.ask()
        state.heartbeats.add(trial._trial_id)
        config = suggest(trial, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype, bucket.path,
                         bucket_ws_gqa(bucket))
        key = config_key(config)
        trial.set_user_attr("config_key", key)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("tuner", TUNER_ID)
        if key in known or (exhaustive and key not in space_keys):
            _tell(study, trial, state, duplicate=True)
            duplicates += 1
            continue
        known.add(key)
        asked.append((trial, config))
    current = study.get_trials(deepcopy=False)
    for trial, config in list(asked):
        if records.taken_by_an_earlier_trial(trial, config_key(config), current):
            _tell(study, trial, state, duplicate=True)
            asked.remove((trial, config))
    return asked, duplicates


def _run_trial(bucket, study, trial, config, settings, worker, state, log) -> None:
    """One prepared candidate's trial in the isolated worker, its outcome told to the study."""
    result = state.timed("trials", worker.run, settings.request(bucket, config), settings.trial_timeout_s)
    state.count_trial(result)
    if (result.get("kind") == "out_of_memory"
            and records.oom_losses(study.get_trials(deepcopy=False), config_key(config)) < _OOM_RETRIES):
        # Out of GPU memory says nothing about the config: drop this attempt, queue the config again.
        log(f"  {bucket.label} trial #{trial.number}: out of GPU memory; queued again")
        _tell(study, trial, state, lost="out_of_memory")
        study.enqueue_trial(_params(bucket, config))
        return
    if result.get("ok"):
        _tell(study, trial, state, value=result["time_us"], log=log, bucket=bucket,
              attrs={n: result[n] for n in ("p10_us", "p90_us", "rel_l2", "max_abs", "calls", "replays", "phases")
                     if n in result})
    else:
        _tell(study, trial, state, failure=(result.get("kind", "error"), result.get("message", "")),
              log=log, bucket=bucket)


def _params(bucket: Bucket, config) -> dict:
    """The Optuna params of `config` in this bucket's space (for enqueue_trial)."""
    return params_of(config, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype, bucket.path,
                     bucket_ws_gqa(bucket))


def _busy(bucket, study_name, state, log, why: str) -> str:
    if study_name not in state.busy_said:
        state.busy_said.add(study_name)
        log(f"  {bucket.label}: {why}; moving on (back later)")
    return BUSY


def _tell(study, trial, state: TunerState, *, value=None, failure=None, duplicate=False, lost=None, attrs=None,
          log=None, bucket=None) -> None:
    """Records a trial's outcome and stops its heartbeat. A trial that a long database outage let
    go stale (failed by another worker, and queued again) keeps that verdict: this result is dropped.
    `lost` (a reason) records an attempt that says nothing about its config: failed without a
    verdict, like a trial whose worker died, so the config stays free to run again."""
    try:
        if duplicate:
            trial.set_user_attr("duplicate", True)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif lost is not None:
            trial.set_user_attr("lost", lost)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif failure is not None:
            trial.set_user_attr("failure", failure[0])
            trial.set_user_attr("failure_message", failure[1][:1000])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            for name, v in (attrs or {}).items():
                trial.set_user_attr(name, v)
            study.tell(trial, value)
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError) as exc:
        if isinstance(exc, StorageUnavailable):
            raise
        recorded = state.db(state.storage.get_trial, trial._trial_id)
        if not recorded.state.is_finished():
            raise
        mine = recorded.user_attrs.get("tuner") == TUNER_ID
        if duplicate or lost is not None:
            ours = recorded.user_attrs.get("duplicate") if duplicate else recorded.user_attrs.get("lost") == lost
        else:
            ours = mine and ("failure" in recorded.user_attrs if failure is not None
                             else recorded.state == optuna.trial.TrialState.COMPLETE)
        if not ours:  # failed by heartbeat while the database was away from us
            if log:
                log(f"  trial #{trial.number} was failed by heartbeat while its result could not be recorded; "
                    f"it is retried by whoever is free")
            return
    finally:
        state.heartbeats.discard(trial._trial_id)
    if duplicate or lost is not None:
        return
    state.trials_run += 1
    if log:
        log(f"  {bucket.label} trial #{trial.number}: {_outcome(value, failure)}")


def _outcome(value, failure) -> str:
    """A trial's log line tail: its time, or why it failed (kind and the message's first line)."""
    if failure is None:
        return f"{value:.2f} us"
    kind, message = failure
    first = records.first_line(message)
    return f"failed ({kind}): {first}" if first else f"failed ({kind})"
