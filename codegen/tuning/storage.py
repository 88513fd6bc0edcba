"""The study database: where it is by default, opening it, retrying calls that lose the
connection, and SQLite write locks. (Heartbeats: heartbeats.py; the finish claim: claims.py.)"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import pathlib
import sys
import threading
import time
import warnings

import optuna

from .heartbeats import OptunaIncompatible, beat_from_the_start, rdb_models

# Heartbeats and their stale-trial callback (open_storage) are features Optuna marks experimental,
# chosen on purpose (heartbeats.py); every command that opens the database (tune, status, export)
# comes through here, and the warnings say nothing a user can act on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# Default home of the SQLite study files: the repository's, like tuned_configs/, so that a run, its
# resume and `msa-tune status` find the same file from any working directory.
STUDY_DIR = pathlib.Path(__file__).resolve().parents[2] / "tune_studies"


def default_url(out_stem: str) -> str:
    """The SQLite study database of a run writing tuned_configs/<out_stem>.json."""
    return f"sqlite:///{STUDY_DIR / (out_stem + '.db')}"


def display_url(url: str) -> str:
    """The storage URL without its password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: show it as given
        return url


def _one_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split()) or type(orig).__name__
    return text[:400]


def connection_problem(exc: BaseException) -> str | None:
    """Why the database could not be used, when `exc` (or what caused it) is a lost or refused
    connection (or a locked SQLite file); None for any other error."""
    import sqlalchemy.exc as sx

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (sx.OperationalError, sx.InterfaceError, sx.DisconnectionError)) or (
                isinstance(exc, sx.DBAPIError) and exc.connection_invalidated):
            return _one_line(exc)
        exc = exc.__cause__ or exc.__context__
    return None


class StorageUnavailable(RuntimeError):
    """The study database could not be reached (at startup) or was lost (mid-run) through every retry."""

    def __init__(self, url: str, reason: str, retries: int = 0, waited_s: float = 0.0, at_startup: bool = False):
        self.url, self.reason, self.retries, self.waited_s, self.at_startup = url, reason, retries, waited_s, at_startup
        tried = f" ({retries} retries over {waited_s:.0f} s)" if retries else ""
        if at_startup:
            text = f"cannot reach the study database at {display_url(url)}{tried}: {reason}"
        else:
            text = (f"lost the study database at {display_url(url)}{tried}. Every trial recorded so far is kept; "
                    f"re-run the same command to resume. Reason: {reason}")
        super().__init__(text)


def startup_failure(exc: Exception) -> int:
    """Says on stderr why a msa-tune command could not start; returns its exit code (tune.py's
    docstring): 3 when the study database cannot be reached, 1 when this Optuna is one msa-tune
    cannot work with, 2 for bad arguments."""
    print(f"msa-tune: {exc}", file=sys.stderr)
    if isinstance(exc, StorageUnavailable):
        return 3
    return 1 if isinstance(exc, OptunaIncompatible) else 2


@dataclasses.dataclass
class DbRetry:
    """Retries a database call that failed for a lost connection: backoff 1, 2, 4, ... s, at most
    `attempts` retries and `budget_s` seconds of waiting in all; then StorageUnavailable."""
    url: str
    attempts: int = 5
    budget_s: float = 30.0
    log: object = None  # callable(str); default: stderr

    def _say(self, line: str) -> None:
        (self.log or (lambda s: print(s, file=sys.stderr, flush=True)))(line)

    def delays(self):
        waited = 0.0
        for attempt in range(self.attempts):
            delay = min(2.0 ** attempt, self.budget_s - waited)
            if delay <= 0:
                return
            waited += delay
            yield attempt + 1, delay, waited

    def call(self, fn, *args, **kwargs):
        schedule = self.delays()
        waited = retries = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except StorageUnavailable:
                raise
            except Exception as exc:
                reason = connection_problem(exc)
                if reason is None:
                    raise
                step = next(schedule, None)
                if step is None:
                    raise StorageUnavailable(self.url, reason, retries, waited) from exc
                retries, delay, waited = step
                self._say(f"msa-tune: study database unreachable ({reason}); retry {retries}/{self.attempts} "
                          f"in {delay:.0f} s")
                time.sleep(delay)


def _retrying_storage_class():
    """RDBStorage whose every database call goes through DbRetry (the heartbeat recorder excepted:
    a lost beat is not worth a wait, the next one comes anyway)."""
    from optuna.storages import RDBStorage

    skip = {"record_heartbeat", "get_heartbeat_interval", "get_heartbeat_stale_trial_callback", "remove_session",
            "_build_frozen_trial_from_trial_model", "_create_unique_study_name"}

    def wrap(fn):
        @functools.wraps(fn)
        def method(self, *args, **kwargs):
            return self.db_retry.call(fn, self, *args, **kwargs)
        return method

    namespace = {}
    for name, fn in vars(RDBStorage).items():
        if (inspect.isfunction(fn) and not name.startswith("__") and name not in skip
                and "session" not in inspect.signature(fn).parameters):
            namespace[name] = wrap(_immediate(fn) if name == "set_trial_state_values" else fn)

    def __init__(self, url, *, db_retry, **kwargs):
        self.db_retry = db_retry
        RDBStorage.__init__(self, url, **kwargs)
        beat_from_the_start(self)

    namespace["__init__"] = __init__
    return type("RetryingRDBStorage", (RDBStorage,), namespace)


_RetryingRDBStorage = None
_SQLITE_HOOKED = False
_IMMEDIATE = threading.local()


def _sqlite_immediate_transactions() -> None:
    """pysqlite starts a transaction only at its first write, so two workers could both read a
    queued trial as WAITING and both pop it (and run it twice). Trial state changes on SQLite (popping
    a queued trial, telling, failing a stale one) therefore open their transaction with BEGIN
    IMMEDIATE, taking the write lock before the read (waited for up to the 60 s timeout): the
    read-then-write is atomic, as SELECT ... FOR UPDATE makes it on PostgreSQL."""
    global _SQLITE_HOOKED
    if _SQLITE_HOOKED:
        return
    import sqlalchemy

    def begin(conn):
        if getattr(_IMMEDIATE, "on", False) and conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "begin", begin)
    _SQLITE_HOOKED = True


def _immediate(fn):
    """Runs `fn` with its SQLite transactions opened by BEGIN IMMEDIATE (see above)."""
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        if self.engine.name != "sqlite":
            return fn(self, *args, **kwargs)
        _IMMEDIATE.on = True
        try:
            return fn(self, *args, **kwargs)
        finally:
            _IMMEDIATE.on = False
    return method


def open_storage(url: str, heartbeat_s: int = 10, retry: DbRetry | None = None):
    """An Optuna RDB storage with heartbeats (a worker killed mid-trial has that trial failed, and
    retried once, after `3 x heartbeat_s` without a beat) and retries on lost connections.
    Raises StorageUnavailable (at_startup) when the database cannot be reached, ValueError for a
    URL that is not one, OptunaIncompatible (before touching the database) when this Optuna lacks
    the internals the heartbeats rely on."""
    global _RetryingRDBStorage
    import sqlalchemy.exc as sx
    from optuna.storages import RetryFailedTrialCallback

    rdb_models()

    retry_cb = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", RetryFailedTrialCallback)
    if _RetryingRDBStorage is None:
        _RetryingRDBStorage = _retrying_storage_class()
    retry = retry or DbRetry(url)
    if url.startswith("sqlite"):
        _sqlite_immediate_transactions()
        engine_kwargs = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
        if url.startswith("postgresql"):  # libpq: fail a connect within 10 s; notice a dead peer within ~1 min
            engine_kwargs["connect_args"] = dict(connect_timeout=10, keepalives=1, keepalives_idle=30,
                                                 keepalives_interval=10, keepalives_count=3)
    schedule = retry.delays()
    waited = retries = 0
    while True:
        try:
            return _RetryingRDBStorage(url, db_retry=retry, engine_kwargs=engine_kwargs,
                                       heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
                                       heartbeat_stale_trial_callback=retry_cb(max_retry=1))
        except ImportError as exc:
            raise StorageUnavailable(url, f"{exc.__cause__ or exc}: the database driver is not installed (PostgreSQL: pip install "
                                          f"'psycopg[binary]', i.e. msa-tune[postgres], and a URL "
                                          f"postgresql+psycopg://...)", at_startup=True) from None
        except sx.ArgumentError as exc:
            raise ValueError(f"--storage: not a database URL SQLAlchemy understands: {display_url(url)} ({exc})") from None
        except (sx.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            # Refused or lost: retry with backoff. Anything else: workers starting together race to
            # create the schema (an integrity error for the losers), so that is retried too.
            reason = connection_problem(exc) or _one_line(exc)
            step = next(schedule, None)
            if step is None:
                raise StorageUnavailable(url, reason, retries, waited, at_startup=True) from None
            retries, delay, waited = step
            if connection_problem(exc):
                retry._say(f"msa-tune: cannot reach the study database yet ({reason}); retry {retries}/"
                           f"{retry.attempts} in {delay:.0f} s")
            time.sleep(min(delay, 1.0) if not connection_problem(exc) else delay)
