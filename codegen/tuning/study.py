"""One Optuna study per bucket: seed with the default, search, confirm, keep only a real gain.

Any number of workers (one process per GPU, on one host or many) can share the studies of one run
through one database: every bucket's study is worked by whichever worker is free (ask/tell, with
claims so that no config runs twice), a worker moves on when the rest of a bucket is being measured
by others, and exactly one worker, the one that wins the bucket's finish claim, runs the
confirmation and publishes the result. A worker killed mid-trial stops beating; its trial is failed
by heartbeat and retried by whoever is free. A worker that loses the database retries with backoff
(`DbRetry`), then stops with StorageUnavailable, leaving everything recorded so far in place.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import time
import warnings
import zlib

import optuna

from ..configs import LaunchConfig
from .buckets import Bucket
from .space import config_key, default_for, enumerate_space, normalize, params_of, suggest
from .storage import (  # noqa: F401 - open_storage, StorageUnavailable and DbRetry re-exported
    DbRetry, StorageUnavailable, _FinishClaim, _Heartbeats, _RESULT, _claim_insert, _claim_read, _claim_swap, open_storage,
)
from .worker import DEFAULT_RUNNER, TrialWorker

optuna.logging.set_verbosity(optuna.logging.WARNING)
# We drive studies with ask/tell and record heartbeats ourselves (_Heartbeats), which Optuna flags
# as experimental; the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
TUNER_ID = f"{socket.gethostname()}:{os.getpid()}"

BUSY = "busy"  # tune_bucket: the rest of this bucket is in other workers' hands for now; come back later
FINISHED_ELSEWHERE = "finished elsewhere"  # tune_bucket: another worker (or an earlier run) finished it


@dataclasses.dataclass
class TuneSettings:
    storage: str
    trials: int = 40  # evaluated configs per bucket (duplicates not counted)
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
    candidates: list | None = None  # search only these LaunchConfigs (plus the default)
    db_retries: int = 5  # a database call that loses the connection is retried this often ...
    db_retry_s: float = 30.0  # ... with backoff (1, 2, 4, ... s) for at most this long in all


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

    @property
    def speedup(self) -> float | None:
        if self.default_us and self.tuned_us:
            return self.default_us / self.tuned_us
        return None


# --- the study database: connection problems, retries, storage ------------------------------------

class TunerState:
    """What one worker process carries across buckets: the storage, its studies, its counts."""

    def __init__(self, settings: TuneSettings, storage=None, log=print):
        self.settings = settings
        self.retry = DbRetry(settings.storage, settings.db_retries, settings.db_retry_s)
        self.storage = storage or open_storage(settings.storage, settings.heartbeat_s, self.retry)
        self.heartbeats = _Heartbeats(self.storage, settings.heartbeat_s)
        self.log = log
        self.studies: dict[str, tuple] = {}
        self.bucket_start: dict[str, float] = {}
        self.claims_seen: dict[int, tuple[str, float]] = {}  # study id -> (claim value, first seen)
        self.busy_said: set[str] = set()
        self.trials_run = 0  # trials this worker ran to a recorded outcome (what the database counts)
        self.confirmations = 0
        self.finished: list[str] = []  # studies this worker finished and published
        self.finished_elsewhere: list[str] = []
        # Wall seconds by phase, for the report: where tuning time goes.
        self.phase_s = {"prepare": 0.0, "trials": 0.0, "confirm": 0.0}
        self.started = time.monotonic()

    def timed(self, phase: str, fn, *args, **kwargs):
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.phase_s[phase] += time.monotonic() - start

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
                f"database and waiting {rest:.0f} s")

    def try_claim(self, study_id: int) -> _FinishClaim | None:
        """The finish claim of a study for this worker, or None while another live worker holds it.
        A claim is free when absent, released ("done", after an earlier finish), or when its beat
        has not moved for 3 heartbeats as seen from here (its worker died)."""
        mine = json.dumps(dict(tuner=TUNER_ID, beat=0, done=False), sort_keys=True)
        if self.db(_claim_insert, self.storage, study_id, mine):
            return _FinishClaim(self.storage, study_id, mine, self.settings.heartbeat_s)
        current = self.db(_claim_read, self.storage, study_id)
        if current is None:
            return None  # released between the two reads: the next visit inserts
        doc = json.loads(current)
        now = time.monotonic()
        seen, since = self.claims_seen.get(study_id, (None, now))
        if seen != current:
            self.claims_seen[study_id] = (current, now)
            since = now
        free = doc.get("done") or doc.get("tuner") == TUNER_ID or now - since > 3 * self.settings.heartbeat_s
        if not free:
            return None
        if doc.get("tuner") != TUNER_ID and not doc.get("done"):
            self.log(f"  the worker {doc.get('tuner')} that was finishing this bucket stopped beating; taking over")
        mine = json.dumps(dict(tuner=TUNER_ID, beat=int(doc.get("beat", 0)) + 1, done=False), sort_keys=True)
        if self.db(_claim_swap, self.storage, study_id, current, mine):
            return _FinishClaim(self.storage, study_id, mine, self.settings.heartbeat_s)
        return None


def _request(bucket: Bucket, config: LaunchConfig, settings: TuneSettings, check: bool = True) -> dict:
    return dict(bucket=dataclasses.asdict(bucket), config=config.to_dict(), interpret=settings.interpret, check=check)


class Preparer:
    """Before a batch of candidates gets GPU time: the static resource check (ahead-of-time compile
    against the arch's limits) and the JIT compile, both in parallel processes on the host's cores."""

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
        except cf.process.BrokenProcessPool:  # a candidate killed a compile process: its trial will say why
            self._pool = None
            return [[] for _ in requests]

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _evaluated(trials) -> list:
    """Trials that measured their config: passed, or failed with a recorded reason. (A trial failed
    for a stale heartbeat, i.e. its worker died, was not evaluated: its retry will be.)"""
    return [t for t in trials if t.user_attrs.get("config_key") and not t.user_attrs.get("duplicate")
            and (t.state == optuna.trial.TrialState.COMPLETE
                 or (t.state == optuna.trial.TrialState.FAIL and "failure" in t.user_attrs))]


def _key_of(trial) -> str | None:
    """A trial's config key: recorded when it ran, or read off the params it was queued with."""
    key = trial.user_attrs.get("config_key")
    if key is None:
        fixed = trial.system_attrs.get("fixed_params") or trial.params
        try:
            key = config_key(LaunchConfig(**fixed)) if fixed else None
        except TypeError:
            key = None
    return key


def _running(trials) -> list:
    return [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and _key_of(t)
            and not t.user_attrs.get("duplicate")]


def _waiting_keys(trials) -> set[str]:
    """Configs queued (enqueue_trial) but not yet picked up by any worker."""
    return {_key_of(t) for t in trials if t.state == optuna.trial.TrialState.WAITING} - {None}


def _taken_by_an_earlier_trial(trial, key: str, trials) -> bool:
    """Two workers may queue and pop the same config at once; the lower trial number runs it."""
    for t in trials:
        if t.number >= trial.number or t.user_attrs.get("duplicate") or _key_of(t) != key:
            continue
        if t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING,
                       optuna.trial.TrialState.COMPLETE) or "failure" in t.user_attrs:
            return True
    return False


def _claimed_keys(trials) -> set[str]:
    """Configs evaluated or being evaluated (by any worker sharing the study): never run twice."""
    return {_key_of(t) for t in _evaluated(trials) + _running(trials)}


def _seed(study, bucket: Bucket, space_keys: set[str], neighbours=None) -> None:
    """The default is always the first trial of a study (the baseline every candidate must beat);
    then the configs chosen for the nearest finished buckets of the same table, when they are in
    this study's space: a neighbour's winner is the likeliest good point, and costs one trial.
    `neighbours` returns those configs; it is called only when the study is seeded."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    queued = set()
    for config in [default_for(bucket), *(neighbours() if neighbours else ())]:
        config = normalize(config)
        key = config_key(config)
        if key in queued or key not in space_keys:
            continue
        queued.add(key)
        study.enqueue_trial(params_of(config, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype),
                            skip_if_exists=True)


_ORPHAN_S = 600


def _fail_orphans(study, trials, state: TunerState) -> None:
    """A trial asked for whose worker died (or lost the database) before its first heartbeat has no
    heartbeat on record, so Optuna never fails it, and it would hold its config forever. Older than
    10 minutes (its start is the asking host's clock: generous for skew), it is failed and queued
    again like a stale one."""
    import sqlalchemy as sa

    now = datetime.datetime.now()
    old = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and t.datetime_start
           and (now - t.datetime_start).total_seconds() > _ORPHAN_S]
    if not old:
        return
    beats = sa.table("trial_heartbeats", sa.column("trial_id"))

    def with_beats():
        with state.storage.engine.connect() as conn:
            ids = [t._trial_id for t in old]
            return set(conn.execute(sa.select(beats.c.trial_id).where(beats.c.trial_id.in_(ids))).scalars())

    beating = state.db(with_beats)
    callback = state.storage.get_heartbeat_stale_trial_callback()
    for t in old:
        if t._trial_id in beating:
            continue
        try:
            if not state.storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        if callback is not None:
            callback(study, state.storage.get_trial(t._trial_id))


def is_final(result: dict | None, target: int) -> bool:
    """A published result ends the bucket for a run asking `target` trials, unless that search was
    cut short by a time budget (a later run resumes it) or asked fewer trials than this run."""
    return bool(result) and bool(result.get("complete")) and int(result.get("target", 0)) >= target


def tune_bucket(bucket: Bucket, study_name: str, settings: TuneSettings, worker: TrialWorker,
                preparer: Preparer, log=print, state: TunerState | None = None, publish=None, neighbours=None):
    """Works on one bucket's study until it is finished or the rest of it is in other workers' hands.

    Returns the BucketResult when this worker finished the bucket (confirmation run, then
    `publish(result)`, whose JSON-able return value is stored in the study as its "result"), BUSY
    when others are measuring what is left (or finishing it), FINISHED_ELSEWHERE when it was
    already finished. Raises StorageUnavailable when the database stays unreachable.
    `neighbours`: a function returning the configs chosen for nearby buckets of the same table,
    queued after the default; called once, when the study is seeded."""
    own_state = state is None
    if own_state:
        state = TunerState(settings, log=log)
    try:
        return _tune_bucket(bucket, study_name, settings, worker, preparer, log, state, publish, neighbours)
    finally:
        if own_state:
            state.close()


def _study_for(bucket, study_name, settings, state, neighbours=None):
    if study_name in state.studies:
        return state.studies[study_name]
    if settings.candidates is not None:
        space = list({config_key(c): c for c in [default_for(bucket)] + [normalize(c) for c in settings.candidates]}.values())
    else:
        space = enumerate_space(bucket.arch, bucket.kernel, num_q_heads=bucket.num_q_heads,
                                num_kv_heads=bucket.num_kv_heads, topk=bucket.topk, kv_dtype=bucket.kv_dtype)
    exhaustive = len(space) <= settings.trials
    # One seed per table: the buckets of a table propose the same points, so their kernels (which do
    # not depend on the token count) compile once for the whole table; different tables (other
    # kernels anyway) explore different points - with one global seed, every table of the H200 run
    # sampled the same first configs.
    seed = (settings.seed + zlib.crc32(bucket.table_key.encode())) % 2**31
    sampler = (optuna.samplers.BruteForceSampler(seed=seed) if exhaustive else
               optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          n_startup_trials=max(5, settings.trials // 4)))
    study = optuna.create_study(study_name=study_name, storage=state.storage, direction="minimize", sampler=sampler,
                                load_if_exists=True)
    _seed(study, bucket, {config_key(c) for c in space}, neighbours)
    if study.user_attrs.get("heartbeat_s") != settings.heartbeat_s:  # for `tune.py status`: when a beat is stale
        study.set_user_attr("heartbeat_s", settings.heartbeat_s)
    state.studies[study_name] = (study, space, exhaustive)
    return state.studies[study_name]


def _tune_bucket(bucket, study_name, settings, worker, preparer, log, state, publish, neighbours=None):
    study, space, exhaustive = _study_for(bucket, study_name, settings, state, neighbours)
    budget_end = state.bucket_start.setdefault(study_name, time.monotonic()) + settings.bucket_time_s
    target = min(settings.trials, len(space))
    batch = max(1, settings.precompile_workers) if not settings.interpret else 1
    space_keys = {config_key(c): c for c in space}
    duplicates_in_a_row = 0
    while True:
        optuna.storages.fail_stale_trials(study)  # trials of dead workers: failed, retried once
        if is_final(study.user_attrs.get(_RESULT), target):
            state.finished_elsewhere.append(study_name)
            return FINISHED_ELSEWHERE
        trials = study.get_trials(deepcopy=False)
        _fail_orphans(study, trials, state)
        done, running = _evaluated(trials), _running(trials)
        known = _claimed_keys(trials)
        unclaimed = [k for k in space_keys if k not in known] if exhaustive else None
        now = time.monotonic()
        cut_short = bool(settings.deadline and now > settings.deadline)
        search_over = (len(done) >= target or now > budget_end or cut_short or duplicates_in_a_row > 200
                       or (exhaustive and not unclaimed))
        if search_over:
            if running:  # wait for them (or for their heartbeat to go stale) elsewhere
                return _busy(bucket, study_name, state, log, f"{len(running)} trials still running elsewhere")
            claim = state.try_claim(study._study_id)
            if claim is None:
                return _busy(bucket, study_name, state, log, "another worker is confirming it")
            return _finish_claimed(bucket, study, study_name, settings, worker, log, state, claim, publish,
                                   complete=not cut_short, target=target)
        room = target - len(done) - len(running)
        if exhaustive:
            # Queue-driven: every unclaimed point gets exactly one trial, whichever worker pops it.
            waiting = _waiting_keys(trials)
            for key in unclaimed[:batch]:
                if key not in waiting:
                    study.enqueue_trial(params_of(space_keys[key], bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype))
            room = min(room, len(unclaimed))
        if room <= 0:  # the rest is being measured by other workers
            return _busy(bucket, study_name, state, log, f"the last {len(running)} trials are running elsewhere")
        state.busy_said.discard(study_name)
        pending = []
        for _ in range(min(batch, room)):
            trial = study.ask()
            state.heartbeats.add(trial._trial_id)
            config = suggest(trial, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype)
            key = config_key(config)
            trial.set_user_attr("config_key", key)
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("tuner", TUNER_ID)
            if key in known or (exhaustive and key not in space_keys):
                _tell(study, trial, state, duplicate=True)
                duplicates_in_a_row += 1
                continue
            duplicates_in_a_row = 0
            known.add(key)
            pending.append((trial, config))
        current = study.get_trials(deepcopy=False)
        for trial, config in list(pending):
            if _taken_by_an_earlier_trial(trial, config_key(config), current):
                _tell(study, trial, state, duplicate=True)
                pending.remove((trial, config))
        problems = state.timed("prepare", preparer, [_request(bucket, c, settings) for _, c in pending])
        for (trial, config), found in zip(list(pending), problems):
            if found:
                _tell(study, trial, state, failure=("static", "; ".join(found)), log=log, bucket=bucket)
                pending.remove((trial, config))
        for trial, config in pending:
            result = state.timed("trials", worker.run, _request(bucket, config, settings), settings.trial_timeout_s)
            if result.get("kind") == "out_of_memory" and _oom_losses(study, config_key(config)) < _OOM_RETRIES:
                # Out of GPU memory says nothing about the config: drop this attempt, queue the config again.
                log(f"  {bucket.label} trial #{trial.number}: out of GPU memory; queued again")
                _tell(study, trial, state, lost="out_of_memory")
                study.enqueue_trial(params_of(config, bucket.arch, bucket.kernel, bucket.topk, bucket.kv_dtype))
                continue
            if result.get("ok"):
                _tell(study, trial, state, value=result["time_us"], log=log, bucket=bucket,
                      attrs={n: result[n] for n in ("p10_us", "p90_us", "rel_l2", "max_abs", "calls", "replays")
                             if n in result})
            else:
                _tell(study, trial, state, failure=(result.get("kind", "error"), result.get("message", "")),
                      log=log, bucket=bucket)
        log(_progress(bucket, study))


_OOM_RETRIES = 2  # attempts of one config lost to out-of-memory before it counts as its failure


def _oom_losses(study, key: str) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get("lost") == "out_of_memory" and t.user_attrs.get("config_key") == key)


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
        outcome = f"{value:.2f} us" if failure is None else f"failed ({failure[0]})"
        log(f"  {bucket.label} trial #{trial.number}: {outcome}")


def _progress(bucket: Bucket, study) -> str:
    done = _evaluated(study.get_trials(deepcopy=False))
    ok = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    best = min((t.value for t in ok), default=None)
    best_text = f"best {best:.2f} us" if best is not None else "no passing config yet"
    return f"  {bucket.label}: {len(done)} trials, {len(done) - len(ok)} failed, {best_text}"


def _pick(bucket: Bucket, completed, tie_tolerance: float):
    """Fastest config; within `tie_tolerance` of it the default wins, else the smallest config key."""
    best = min(t.value for t in completed)
    ties = [t for t in completed if t.value <= best * (1 + tie_tolerance)]
    default_key = config_key(default_for(bucket))
    for t in ties:
        if t.user_attrs["config_key"] == default_key:
            return t
    return min(ties, key=lambda t: (t.user_attrs["config_key"]))


def _confirm(bucket, candidate: LaunchConfig, default: LaunchConfig, settings, worker) -> tuple[float, float] | None:
    """Median times of default and candidate, measured alternately (so drift hits both alike)."""
    times = {"default": [], "candidate": []}
    for _ in range(settings.confirm_rounds):
        for name, config in (("default", default), ("candidate", candidate)):
            result = worker.run(_request(bucket, config, settings, check=False), settings.trial_timeout_s)
            if not result.get("ok"):
                return None
            times[name].append(result["time_us"])
    return statistics.median(times["default"]), statistics.median(times["candidate"])


def _finish_claimed(bucket, study, study_name, settings, worker, log, state, claim, publish, *, complete, target):
    """Under this worker's finish claim: confirm, publish (the JSON), record the result, release."""
    try:
        result = _finish(bucket, study, study_name, settings, worker, log, state)
    finally:
        claim.stop()
    if not state.db(claim.beat):  # taken over while we looked dead: the new holder publishes
        log(f"  {bucket.label}: another worker took over finishing it")
        return BUSY
    record = publish(result) if publish else {}
    evaluated = len(_evaluated(study.get_trials(deepcopy=False)))
    study.set_user_attr(_RESULT, dict(record or {}, complete=complete, target=target, evaluated=evaluated,
                                      tuner=TUNER_ID, config=result.config.to_dict(), is_default=result.is_default,
                                      default_us=result.default_us, tuned_us=result.tuned_us, note=result.note,
                                      finished_at=datetime.datetime.now(datetime.timezone.utc)
                                      .isoformat(timespec="seconds")))
    state.db(claim.beat, done=True)
    state.finished.append(study_name)
    return result


def _finish(bucket, study, study_name, settings, worker, log, state=None) -> BucketResult:
    trials = study.get_trials(deepcopy=False)
    done = _evaluated(trials)
    failed = [t for t in done if t.state == optuna.trial.TrialState.FAIL]
    kinds: dict[str, int] = {}
    for t in failed:
        kinds[t.user_attrs.get("failure", "error")] = kinds.get(t.user_attrs.get("failure", "error"), 0) + 1
    completed = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    default = default_for(bucket)
    common = dict(bucket=bucket, trials=len(done), failures=len(failed), failure_kinds=kinds, study_name=study_name)
    if not completed:
        return BucketResult(config=default, is_default=True, default_us=None, tuned_us=None,
                            note="no config passed; the default stays", **common)
    best = _pick(bucket, completed, settings.tie_tolerance)
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
        confirmed = (state.timed("confirm", _confirm, bucket, candidate, default, settings, worker) if state is not None
                     else _confirm(bucket, candidate, default, settings, worker))
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
