"""Several tune.py workers on one study database, one of them SIGKILLed mid-trial.

Shared by the PostgreSQL tests beside this file and the SQLite test in tests/interp/test_tune.py:
the same run, the same checks, only the storage URL differs. Workers are real `tune.py`
processes (CPU, Triton interpreter, tiny buckets; `tune_faults:slow` adds a delay to every trial
so the kill lands mid-trial); their output goes to log files so a killed worker's lines survive.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import optuna

from codegen.tuning.storage import display_url  # noqa: F401 - for the tests

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--interpret", "--arch", "sm90", "--modes", "scalar:fp8", "--layouts", "tp8", "--head-dim", "32",
        "--topk", "4", "--decode-context", "300", "--prefill-prefix", "200", "--kernels", "decode"]
CANDIDATES = [dict(block_n=b, num_warps=w, num_stages=1, num_splits=2) for b in (32, 64) for w in (2, 4, 8)]
PER_BUCKET = len(CANDIDATES) + 1  # the default is always trial 0
DONE = optuna.trial.TrialState


def worker_id(proc) -> str:
    return f"{socket.gethostname()}:{proc.pid}"


def spawn(storage: str, tmp_path: pathlib.Path, name: str, *, buckets: str = "1,2,3", delay: float = 1.0,
          extra=()) -> subprocess.Popen:
    """A tune.py worker in its own process group (so a kill takes its trial process too)."""
    env = dict(os.environ, TUNE_TEST_DELAY=str(delay), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "interp")]))
    argv = [sys.executable, str(REPO / "tune.py"), *TINY, "--decode-buckets", buckets, "--trials", "20",
            "--heartbeat", "1", "--trial-timeout", "60", "--runner", "tune_faults:slow",
            "--candidates", json.dumps(CANDIDATES), "--out", str(tmp_path / "cfg"), "--storage", storage, *extra]
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    proc.log_path = tmp_path / f"{name}.log"
    log.close()
    return proc


def output(proc) -> str:
    return proc.log_path.read_text()


def studies(storage: str) -> dict[str, tuple[dict, list]]:
    """study name -> (user attrs, trials), read with a plain Optuna storage."""
    store = optuna.storages.RDBStorage(storage)
    try:
        return {s.study_name: (s.user_attrs, store.get_all_trials(s._study_id))
                for s in store.get_all_studies()}
    finally:
        store.engine.dispose()


def evaluated(trials) -> list:
    """Trials that measured their config (what a worker counts as a trial it ran)."""
    return [t for t in trials if t.user_attrs.get("config_key") and not t.user_attrs.get("duplicate")
            and (t.state == DONE.COMPLETE or (t.state == DONE.FAIL and "failure" in t.user_attrs))]


def wait_for(predicate, timeout: float, what: str, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a worker exited early (rc {p.returncode}):\n{output(p)}")
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@dataclasses.dataclass
class Run:
    storage: str
    procs: list
    victim: subprocess.Popen
    in_flight: object  # the victim's trial that was running when it was killed
    in_flight_study: str


def three_workers_one_killed(storage: str, tmp_path: pathlib.Path, timeout: float = 240) -> Run:
    procs = [spawn(storage, tmp_path, f"worker{i}") for i in range(3)]
    victim = procs[0]
    vid = worker_id(victim)

    def victim_mid_trial():
        try:
            found = studies(storage)
        except Exception:  # noqa: BLE001 - schema not created yet
            return None
        mine = [(name, t) for name, (_, trials) in found.items() for t in trials if t.user_attrs.get("tuner") == vid]
        running = [(name, t) for name, t in mine if t.state == DONE.RUNNING and not t.user_attrs.get("duplicate")]
        if running and any(t in evaluated([t]) for _, t in mine):
            return running[0]
        return None

    try:
        name, trial = wait_for(victim_mid_trial, 150, "the victim worker running its second trial", procs)
        kill_group(victim)  # SIGKILL: the worker and its trial process, mid-trial
        for p in procs[1:]:
            p.wait(timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)
    return Run(storage, procs, victim, trial, name)


def check(run: Run, tmp_path: pathlib.Path, buckets=(1, 2, 3)) -> None:
    """Every bucket finished; the DB's trial counts match what each worker reported; no config ran
    twice; the killed worker's trial was failed by heartbeat and measured by another worker; the
    JSON was written once per bucket, validates, and the loader returns it."""
    from codegen import get_config, tuned_store
    from codegen.configs import LaunchConfig

    survivors = run.procs[1:]
    for p in survivors:
        assert p.returncode == 0, output(p)
        assert "Traceback" not in output(p), output(p)
    found = studies(run.storage)
    assert len(found) == len(buckets), sorted(found)
    by_tuner: dict[str, int] = {}
    for name, (attrs, trials) in found.items():
        done = evaluated(trials)
        keys = [t.user_attrs["config_key"] for t in done]
        assert len(keys) == len(set(keys)) == PER_BUCKET, (name, keys)  # every config once, none twice
        assert attrs["result"]["complete"] and attrs["result"]["evaluated"] == PER_BUCKET, attrs["result"]
        for t in done:
            by_tuner[t.user_attrs["tuner"]] = by_tuner.get(t.user_attrs["tuner"], 0) + 1
    assert sum(by_tuner.values()) == PER_BUCKET * len(buckets)

    # The killed worker's trial: failed by heartbeat (no recorded reason), queued again by the
    # retry callback, and its config measured by a surviving worker.
    attrs, trials = found[run.in_flight_study]
    dead = next(t for t in trials if t.number == run.in_flight.number)
    assert dead.state == DONE.FAIL and "failure" not in dead.user_attrs, dead
    assert any(t.system_attrs.get("failed_trial") == dead.number for t in trials), "no retry was queued"
    key = dead.user_attrs["config_key"]
    redone = [t for t in evaluated(trials) if t.user_attrs["config_key"] == key]
    assert len(redone) == 1 and redone[0].user_attrs["tuner"] != worker_id(run.victim), redone

    # What each worker says it ran is what the database holds under its name.
    for p in survivors:
        match = re.search(r"worker (\S+) ran (\d+) trials", output(p))
        assert match and match.group(1) == worker_id(p), output(p)
        assert int(match.group(2)) == by_tuner.get(worker_id(p), 0), (match.group(0), by_tuner)
    victim_lines = re.findall(r"^  \S+ trial #\d+: ", output(run.victim), flags=re.M)
    assert len(victim_lines) == by_tuner.get(worker_id(run.victim), 0), (victim_lines, by_tuner)
    assert len([t for t in by_tuner if by_tuner[t]]) >= 2, by_tuner

    # The JSON: each bucket written exactly once, by the worker that finished it.
    writes = [line for p in run.procs for line in output(p).splitlines() if line.startswith("msa-tune: wrote ")]
    assert len(writes) == len(buckets), writes
    path = tmp_path / "cfg" / "sm90__cpu_interpreter.json"
    doc = tuned_store.read_document(path)
    table = doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]
    assert sorted(map(int, table)) == list(buckets)
    os.environ[tuned_store.CONFIG_DIR_ENV] = str(path.parent)
    try:
        for tokens in buckets:
            entry = table[str(tokens)]
            choice = get_config("decode", "sm90", "cpu-interpreter", "scalar", "fp8", 8, 1, tokens, topk=4)
            assert choice.source == "tuned:exact" and choice.config == LaunchConfig.from_dict(entry["config"])
            attrs, _ = found[entry["study"]]
            assert attrs["result"]["entry"] == entry  # the database holds what the file holds
    finally:
        os.environ.pop(tuned_store.CONFIG_DIR_ENV, None)


def tune_cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "tune.py"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def check_status_and_export(storage: str, tmp_path: pathlib.Path, buckets=(1, 2, 3)) -> None:
    """`tune.py status` shows every bucket finished and nothing running; `tune.py export` rebuilds
    the same buckets the workers wrote."""
    from codegen import tuned_store

    status = tune_cli("status", "--storage", storage)
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if line.startswith("  decode/")]
    assert len(rows) == len(buckets), status.stdout
    for row in rows:
        assert f"{PER_BUCKET:5d}    0" in row and "finished" in row, row
    assert "workers alive" in status.stdout
    export = tune_cli("export", "--storage", storage, "--out", str(tmp_path / "exported"))
    assert export.returncode == 0, export.stdout + export.stderr
    name = "sm90__cpu_interpreter.json"
    exported = tuned_store.read_document(tmp_path / "exported" / name)
    written = tuned_store.read_document(tmp_path / "cfg" / name)
    key = "decode/scalar/fp8/8x1"
    assert exported["tables"][key]["buckets"] == written["tables"][key]["buckets"]
    for folder in (tmp_path / "exported", tmp_path / "cfg"):  # the files only: no lock file left beside them
        assert sorted(p.name for p in folder.iterdir()) == [name], sorted(folder.iterdir())
