"""The per-bucket finish claim: exactly one worker confirms a bucket and publishes it.

The claim is a study user attribute {"tuner", "beat", "done"} changed only by compare-and-set on
the database row, kept alive by a beat; a claim whose beat stops moving for 3 heartbeats (its
worker died) is taken over by the next worker that visits the bucket. A worker that fails while
finishing (it is alive to see it) deletes its claim instead, so nobody waits for it.
"""
from __future__ import annotations

import json
import threading
import time

CLAIM = "finishing"  # study user attr name


def _attrs_table():
    import sqlalchemy as sa

    return sa.table("study_user_attributes", sa.column("study_id"), sa.column("key"), sa.column("value_json"))


def claim_read(storage, study_id: int) -> str | None:
    import sqlalchemy as sa

    t = _attrs_table()
    with storage.engine.connect() as conn:
        return conn.execute(sa.select(t.c.value_json).where(t.c.study_id == study_id, t.c.key == CLAIM)).scalar()


def claim_insert(storage, study_id: int, value: str) -> bool:
    """True when this worker created the claim; False when someone else has one (unique key)."""
    import sqlalchemy as sa
    import sqlalchemy.exc as sx

    try:
        with storage.engine.begin() as conn:
            conn.execute(sa.insert(_attrs_table()).values(study_id=study_id, key=CLAIM, value_json=value))
        return True
    except sx.IntegrityError:
        return False


def claim_delete(storage, study_id: int, value: str) -> bool:
    """Compare-and-delete: the claim goes only if it still is `value` (ours)."""
    import sqlalchemy as sa

    t = _attrs_table()
    with storage.engine.begin() as conn:
        result = conn.execute(sa.delete(t).where(t.c.study_id == study_id, t.c.key == CLAIM, t.c.value_json == value))
        return result.rowcount == 1


def claim_swap(storage, study_id: int, old: str, new: str) -> bool:
    """Compare-and-set: the claim becomes `new` only if it still is `old`."""
    import sqlalchemy as sa

    t = _attrs_table()
    with storage.engine.begin() as conn:
        result = conn.execute(sa.update(t).where(t.c.study_id == study_id, t.c.key == CLAIM, t.c.value_json == old)
                              .values(value_json=new))
        return result.rowcount == 1


class FinishClaim:
    """This worker's hold on finishing one study (confirmation + publishing), kept alive by a beat."""

    def __init__(self, storage, study_id: int, value: str, interval_s: int):
        self._storage, self._study_id, self.value = storage, study_id, value
        self._interval = interval_s
        self._lock = threading.Lock()
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, daemon=True, name="msa-tune-claim")
        self._thread.start()

    def _next(self, **changes) -> str:
        doc = json.loads(self.value)
        doc["beat"] += 1
        doc.update(changes)
        return json.dumps(doc, sort_keys=True)

    def beat(self, **changes) -> bool:
        with self._lock:
            if self.lost:
                return False
            new = self._next(**changes)
            if claim_swap(self._storage, self._study_id, self.value, new):
                self.value = new
                return True
            self.lost = True  # another worker took it over (we looked dead to it)
            return False

    def _beat_loop(self):
        while not self._stop.wait(self._interval):
            try:
                if not self.beat():
                    return
            except Exception:  # noqa: BLE001 - the database is away: the next beat tries again
                pass

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def release(self) -> None:
        """Gives the bucket back after a failure here (e.g. the table could not be written), so the
        next worker claims it at once instead of waiting 3 heartbeats for this one to look dead.
        Best effort: with the database gone, the claim goes stale as it would for a dead worker."""
        self.stop()
        with self._lock:
            if self.lost:
                return
            try:
                claim_delete(self._storage, self._study_id, self.value)
            except Exception:  # noqa: BLE001 - the failure being reported matters more
                pass
            self.lost = True


def try_claim(state, study_id: int, tuner: str) -> FinishClaim | None:
    """The finish claim of a study for `tuner`, or None while another live worker holds it.
    A claim is free when absent, released ("done", after an earlier finish), or when its beat has
    not moved for 3 heartbeats as seen from here (its worker died). `state` (a TunerState) gives
    the storage, the retrying database call, the heartbeat and what claims were seen when."""
    interval = state.settings.heartbeat_s
    mine = json.dumps(dict(tuner=tuner, beat=0, done=False), sort_keys=True)
    if state.db(claim_insert, state.storage, study_id, mine):
        return FinishClaim(state.storage, study_id, mine, interval)
    current = state.db(claim_read, state.storage, study_id)
    if current is None:
        return None  # released between the two reads: the next visit inserts
    doc = json.loads(current)
    now = time.monotonic()
    seen, since = state.claims_seen.get(study_id, (None, now))
    if seen != current:
        state.claims_seen[study_id] = (current, now)
        since = now
    free = doc.get("done") or doc.get("tuner") == tuner or now - since > 3 * interval
    if not free:
        return None
    if doc.get("tuner") != tuner and not doc.get("done"):
        state.log(f"  the worker {doc.get('tuner')} that was finishing this bucket stopped beating; taking over")
    mine = json.dumps(dict(tuner=tuner, beat=int(doc.get("beat", 0)) + 1, done=False), sort_keys=True)
    if state.db(claim_swap, state.storage, study_id, current, mine):
        return FinishClaim(state.storage, study_id, mine, interval)
    return None
