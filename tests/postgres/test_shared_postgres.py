"""tune.py workers sharing a real PostgreSQL on loopback (CPU, Triton interpreter, tiny buckets).

CI provides the server: .ci/run starts one with scripts/postgres.sh and exports its URL as
MSA_TUNE_TEST_PG_URL (postgresql+psycopg://postgres@127.0.0.1:PORT/msa_tune); scripts/test.sh runs
this folder only then. Locally:

  bash scripts/postgres.sh start /tmp/pg 55432
  MSA_TUNE_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:55432/msa_tune \\
      .venv/bin/python -m pytest -q tests/postgres
  bash scripts/postgres.sh stop /tmp/pg 55432

Each test gets a database of its own on that server (created and dropped here).
"""
import os
import re
import select
import socket
import struct
import threading
import uuid

import pytest

import multiworker as M

URL = os.environ.get("MSA_TUNE_TEST_PG_URL")
pytestmark = pytest.mark.skipif(
    not URL, reason="MSA_TUNE_TEST_PG_URL is not set: no PostgreSQL server to test against (CI starts one in "
                    ".ci/run with scripts/postgres.sh; see this file's docstring to run it locally)")


@pytest.fixture
def pg_url():
    """A fresh database on the server of MSA_TUNE_TEST_PG_URL; dropped afterwards."""
    import sqlalchemy as sa

    admin = sa.engine.make_url(URL)
    name = f"msa_tune_test_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


def test_three_workers_one_killed_postgres(pg_url, tmp_path):
    """Three workers share three buckets; one is SIGKILLed mid-trial. Every bucket still finishes,
    the trial counts in the database match what each worker reports, no config runs twice, the
    dead worker's trial is failed by heartbeat and measured elsewhere, the JSON is written once per
    bucket and the loader returns it; `status` and `export` read the same database."""
    run = M.three_workers_one_killed(pg_url, tmp_path)
    M.check(run, tmp_path)
    M.check_status_and_export(pg_url, tmp_path)


class _Cuttable:
    """A loopback TCP forwarder to the PostgreSQL server that the test can cut (every connection
    reset, new ones reset on arrival) and restore, to play a lost database. It holds its port from
    start to close, so nothing else can take it while cut (closing and re-binding the listener
    raced with other sockets for the port: "Address already in use"). Bounded: it serves only
    while the test runs, and only 127.0.0.1."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._cut = False
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def restore(self):
        self._cut = False

    def cut(self):
        self._cut = True
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            _reset(c)

    def close(self):
        self._stop.set()
        self.cut()
        self._listener.close()

    def _accept(self):
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._cut:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a, b):
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.5)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass


def _reset(conn: socket.socket) -> None:
    """Closes with a TCP reset (linger 0): the peer sees the connection lost, not an orderly end."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    except OSError:
        pass


def _evaluated_by(url, tuner):
    return sum(1 for _, trials in M.studies(url).values() for t in M.evaluated(trials)
               if t.user_attrs.get("tuner") == tuner)


def test_lost_database_is_retried_then_a_clear_exit(pg_url, tmp_path):
    """A worker whose database goes away rides out a short outage (retries with backoff); after a
    long one it exits with code 3 and one clear line, no traceback; every trial it reported is in the
    database, and the same command on the database resumes and finishes without repeating one."""
    import sqlalchemy as sa

    real = sa.engine.make_url(pg_url)
    proxy = _Cuttable(real.host or "127.0.0.1", real.port or 5432)
    via_proxy = real.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        worker = M.spawn(via_proxy, tmp_path, "worker", buckets="2", delay=1.0,
                         extra=["--db-retries", "4", "--db-retry-seconds", "8"])
        tuner = M.worker_id(worker)
        M.wait_for(lambda: _evaluated_by(pg_url, tuner) >= 1, 120, "a first trial", [worker])
        # A short outage: cut until the worker has met it (a trial on a busy CI machine can outlast any
        # fixed sleep, and then the worker never needs the database while it is cut), then restore
        # within its retries (1 + 2 + 4 s).
        proxy.cut()
        M.wait_for(lambda: "study database unreachable" in M.output(worker), 120,
                   "the worker meeting the outage", [worker])
        proxy.restore()
        before = _evaluated_by(pg_url, tuner)
        M.wait_for(lambda: _evaluated_by(pg_url, tuner) > before, 60, "a trial after the short outage", [worker])
        assert "study database unreachable" in M.output(worker) and worker.poll() is None, M.output(worker)
        proxy.cut()  # for good
        worker.wait(60)
    finally:
        proxy.close()
        if worker.poll() is None:
            M.kill_group(worker)
    out = M.output(worker)
    assert worker.returncode == 3, out
    assert "Traceback" not in out, out
    assert "retry 4/4 in 1 s" in out, out  # backoff 1, 2, 4 s, then what is left of the 8 s
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"msa-tune: lost the study database at {M.display_url(via_proxy)}"), last
    assert "re-run the same command to resume" in last, last
    reported = int(re.search(r"worker \S+ ran (\d+) trials", out).group(1))
    assert reported == _evaluated_by(pg_url, tuner) >= 2, out  # nothing it recorded was lost

    resumed = M.spawn(pg_url, tmp_path, "resumed", buckets="2", delay=0.0)
    assert resumed.wait(180) == 0, M.output(resumed)
    (attrs, trials), = M.studies(pg_url).values()
    keys = [t.user_attrs["config_key"] for t in M.evaluated(trials)]
    assert len(keys) == len(set(keys)) == M.PER_BUCKET, keys
    assert attrs["result"]["complete"]
