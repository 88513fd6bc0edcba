"""Heartbeats: a trial beats from the moment it is RUNNING until it is told, so a worker killed
anywhere in between has its trial failed (after 3 missed beats) and retried by whoever is free.

Optuna fails a stale trial only when it has a heartbeat on record. Two things close the gaps
around that: every trial gets its first beat in the very transaction that makes it RUNNING
(`beat_from_the_start`, which hooks Optuna's private RDB models and refuses to run without them),
and a RUNNING trial without any beat that is older than ORPHAN_S is failed and queued again
(`fail_orphans`).
"""
from __future__ import annotations

import datetime
import threading

import optuna

ORPHAN_S = 600  # seconds before a RUNNING trial with no heartbeat on record counts as an orphan


class OptunaIncompatible(RuntimeError):
    """This Optuna lacks an internal that msa-tune's bookkeeping relies on."""


def rdb_models():
    """Optuna's private RDB models, checked for what beat_from_the_start uses; raises
    OptunaIncompatible (naming the installed version) when they moved."""
    try:
        import sqlalchemy.orm
        from optuna.storages._rdb import models

        sqlalchemy.orm.configure_mappers()  # backrefs such as TrialModel.heartbeats exist only after this
    except ImportError as exc:
        raise OptunaIncompatible(f"optuna {optuna.__version__}: optuna.storages._rdb.models is gone ({exc}); "
                                 f"msa-tune records a trial's first heartbeat through it: install an optuna "
                                 f"version it was tested with (4.x, 5.x)") from None
    for name, attrs in (("TrialModel", ("state", "heartbeats")), ("TrialHeartbeatModel", ("trial",))):
        model = getattr(models, name, None)
        missing = [a for a in attrs if model is None or not hasattr(model, a)]
        if missing:
            raise OptunaIncompatible(f"optuna {optuna.__version__}: optuna.storages._rdb.models.{name} has no "
                                     f"{', '.join(missing)}; msa-tune records a trial's first heartbeat through it: "
                                     f"install an optuna version it was tested with (4.x, 5.x)")
    return models


def beat_from_the_start(storage) -> None:
    """Every trial gets its first heartbeat in the very transaction that makes it RUNNING (a fresh
    ask, or a queued trial popped): a worker killed between asking and its first beat would
    otherwise leave a trial that Optuna never fails, holding its config forever."""
    import sqlalchemy

    models = rdb_models()
    running = optuna.trial.TrialState.RUNNING

    def before_flush(session, _context, _instances):
        for obj in session.new:  # Optuna flushes every new trial as RUNNING, then sets a template's state
            if isinstance(obj, models.TrialModel):
                session.info.setdefault("msa_tune_new_trials", []).append(obj)
        for obj in session.dirty:  # a queued trial popped
            if isinstance(obj, models.TrialModel) and obj.state == running and not obj.heartbeats:
                session.add(models.TrialHeartbeatModel(trial=obj))

    def before_commit(session):
        for obj in session.info.pop("msa_tune_new_trials", []):
            if obj.state == running and not obj.heartbeats:  # asked (not queued): beats from now
                session.add(models.TrialHeartbeatModel(trial=obj))

    def after_transaction_end(session, transaction):
        if transaction.parent is None:  # the outermost one: committed or rolled back
            session.info.pop("msa_tune_new_trials", None)

    sqlalchemy.event.listen(storage.scoped_session, "before_flush", before_flush)
    sqlalchemy.event.listen(storage.scoped_session, "before_commit", before_commit)
    sqlalchemy.event.listen(storage.scoped_session, "after_transaction_end", after_transaction_end)


class Heartbeats:
    """Beats for every trial this worker holds, from the moment it asks for one until it tells it,
    so a worker killed anywhere in between (preparing, running) has its trials failed and retried."""

    def __init__(self, storage, interval_s: int):
        self._storage, self._interval = storage, interval_s
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="msa-tune-heartbeats")
        self._thread.start()

    def add(self, trial_id: int) -> None:
        # Beat at once (and retried): Optuna only ever fails trials that have a heartbeat on record.
        self._storage.db_retry.call(self._storage.record_heartbeat, trial_id)
        with self._lock:
            self._ids.add(trial_id)

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def _beat(self):
        while not self._stop.wait(self._interval):
            with self._lock:
                ids = list(self._ids)
            for trial_id in ids:
                try:
                    self._storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a lost beat only risks a retry elsewhere
                    pass

    def close(self):
        self._stop.set()
        self._thread.join(5)


def fail_orphans(study, trials, storage, db) -> None:
    """A trial asked for by another client (or before beat_from_the_start existed) whose worker
    died before its first heartbeat has no heartbeat on record, so Optuna never fails it. Older
    than ORPHAN_S (its start is the asking host's clock: generous for skew), it is failed and
    queued again like a stale one. `db` runs a database call with retries."""
    import sqlalchemy as sa

    now = datetime.datetime.now()
    old = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and t.datetime_start
           and (now - t.datetime_start).total_seconds() > ORPHAN_S]
    if not old:
        return
    beats = sa.table("trial_heartbeats", sa.column("trial_id"))

    def with_beats():
        with storage.engine.connect() as conn:
            ids = [t._trial_id for t in old]
            return set(conn.execute(sa.select(beats.c.trial_id).where(beats.c.trial_id.in_(ids))).scalars())

    beating = db(with_beats)
    callback = storage.get_heartbeat_stale_trial_callback()
    for t in old:
        if t._trial_id in beating:
            continue
        try:
            if not storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        if callback is not None:
            callback(study, storage.get_trial(t._trial_id))
