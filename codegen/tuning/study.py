"""One Optuna study per bucket: seed with the default, search, confirm, keep only a real gain."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time
import warnings

import optuna

from ..configs import LaunchConfig
from .buckets import Bucket
from .space import config_key, default_for, enumerate_space, normalize, params_of, suggest
from .worker import DEFAULT_RUNNER, TrialWorker

optuna.logging.set_verbosity(optuna.logging.WARNING)
# We drive studies with ask/tell and record heartbeats ourselves (_Heartbeat), which Optuna flags
# as experimental; the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
TUNER_ID = f"{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass
class TuneSettings:
    storage: str
    trials: int = 40  # evaluated configs per bucket (duplicates not counted)
    bucket_time_s: float = 300.0
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


def open_storage(url: str, heartbeat_s: int = 10):
    """An Optuna RDB storage with heartbeats: a worker killed mid-trial has that trial failed (and
    retried once) after `3 x heartbeat_s` without a beat."""
    from optuna.storages import RDBStorage, RetryFailedTrialCallback

    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(5):
        try:
            return RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s,
                              grace_period=3 * heartbeat_s,
                              heartbeat_stale_trial_callback=RetryFailedTrialCallback(max_retry=1))
        except Exception:  # noqa: BLE001 - workers starting together race to create the schema: retry
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))


class _Heartbeat:
    """Records a trial's heartbeat while the worker runs it."""

    def __init__(self, storage, trial_id: int, interval_s: int):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(storage, trial_id, interval_s), daemon=True)

    def _beat(self, storage, trial_id, interval_s):
        # Beat at once: Optuna only ever fails trials that have a heartbeat on record.
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a lost beat only risks a retry elsewhere
                pass
            if self._stop.wait(interval_s):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


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


def _seed(study, bucket: Bucket) -> None:
    """The default is always the first trial of a study (the baseline every candidate must beat)."""
    if study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    study.enqueue_trial(params_of(default_for(bucket), bucket.arch, bucket.kernel, bucket.topk), skip_if_exists=True)


def tune_bucket(bucket: Bucket, study_name: str, settings: TuneSettings, worker: TrialWorker,
                preparer: Preparer, log=print) -> BucketResult:
    storage = open_storage(settings.storage, settings.heartbeat_s)
    if settings.candidates is not None:
        space = list({config_key(c): c for c in [default_for(bucket)] + [normalize(c) for c in settings.candidates]}.values())
    else:
        space = enumerate_space(bucket.arch, bucket.kernel, num_q_heads=bucket.num_q_heads,
                                num_kv_heads=bucket.num_kv_heads, topk=bucket.topk)
    exhaustive = len(space) <= settings.trials
    sampler = (optuna.samplers.BruteForceSampler(seed=settings.seed) if exhaustive else
               optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, group=True,
                                          n_startup_trials=max(5, settings.trials // 4)))
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize", sampler=sampler,
                                load_if_exists=True)
    _seed(study, bucket)
    budget_end = time.monotonic() + settings.bucket_time_s
    target = min(settings.trials, len(space))
    batch = max(1, settings.precompile_workers) if not settings.interpret else 1
    space_keys = {config_key(c): c for c in space}
    duplicates_in_a_row = 0
    while True:
        optuna.storages.fail_stale_trials(study)  # trials of dead workers: failed, retried once
        trials = study.get_trials(deepcopy=False)
        done, running = _evaluated(trials), _running(trials)
        now = time.monotonic()
        if len(done) >= target or now > budget_end or (settings.deadline and now > settings.deadline):
            break
        if duplicates_in_a_row > 200:  # the sampler keeps proposing evaluated points: space exhausted
            break
        known = _claimed_keys(trials)
        room = target - len(done) - len(running)
        if exhaustive:
            # Queue-driven: every unclaimed point gets exactly one trial, whichever worker pops it.
            unclaimed = [k for k in space_keys if k not in known]
            if not unclaimed and not running:
                break
            waiting = _waiting_keys(trials)
            for key in unclaimed[:batch]:
                if key not in waiting:
                    study.enqueue_trial(params_of(space_keys[key], bucket.arch, bucket.kernel, bucket.topk))
            room = min(room, len(unclaimed))
        if room <= 0:  # the rest is being measured by other workers: wait for them (or their heartbeat)
            time.sleep(min(1.0, settings.heartbeat_s))
            continue
        pending = []
        for _ in range(min(batch, room)):
            trial = study.ask()
            config = suggest(trial, bucket.arch, bucket.kernel, bucket.topk)
            key = config_key(config)
            trial.set_user_attr("config_key", key)
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("tuner", TUNER_ID)
            if key in known or (exhaustive and key not in space_keys):
                trial.set_user_attr("duplicate", True)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                duplicates_in_a_row += 1
                continue
            duplicates_in_a_row = 0
            known.add(key)
            pending.append((trial, config))
        current = study.get_trials(deepcopy=False)
        for trial, config in list(pending):
            if _taken_by_an_earlier_trial(trial, config_key(config), current):
                trial.set_user_attr("duplicate", True)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                pending.remove((trial, config))
        problems = preparer([_request(bucket, c, settings) for _, c in pending])
        for (trial, config), found in zip(list(pending), problems):
            if found:
                _fail(study, trial, "static", "; ".join(found))
                pending.remove((trial, config))
        for trial, config in pending:
            with _Heartbeat(storage, trial._trial_id, settings.heartbeat_s):
                result = worker.run(_request(bucket, config, settings), settings.trial_timeout_s)
            if result.get("ok"):
                for name in ("p10_us", "p90_us", "rel_l2", "max_abs", "calls", "replays"):
                    if name in result:
                        trial.set_user_attr(name, result[name])
                study.tell(trial, result["time_us"])
            else:
                _fail(study, trial, result.get("kind", "error"), result.get("message", ""))
        log(_progress(bucket, study))
    return _finish(bucket, study, study_name, settings, worker, log)


def _fail(study, trial, kind: str, message: str) -> None:
    trial.set_user_attr("failure", kind)
    trial.set_user_attr("failure_message", message[:1000])
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


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


def _finish(bucket, study, study_name, settings, worker, log) -> BucketResult:
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
    # A finished study confirms once; re-running it reuses the stored confirmation (same study, same file).
    stored = study.user_attrs.get("confirmation")
    if stored and stored.get("candidate") == config_key(candidate):
        default_us, tuned_us = stored["default_us"], stored["tuned_us"]
    else:
        confirmed = _confirm(bucket, candidate, default, settings, worker)
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
