"""The tune pipeline end to end under the interpreter (timings meaningless, the pipeline is real):
JSON written and picked up by the loader, failing trials recorded, resume, shared studies."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import tune
from codegen import get_config, tuned_store
from codegen.configs import LaunchConfig

TINY = ["--interpret", "--arch", "sm90", "--modes", "scalar:fp8", "--layouts", "tp8", "--head-dim", "32",
        "--topk", "4", "--decode-context", "300", "--prefill-prefix", "200"]


def _run(tmp_path, *extra):
    out = tmp_path / "cfg"
    argv = TINY + ["--out", str(out), "--storage", f"sqlite:///{tmp_path / 'study.db'}", *extra]
    assert tune.main(argv) == 0
    return out / "sm90__cpu_interpreter.json"


def _trials(db, state=None):
    con = sqlite3.connect(db)
    rows = con.execute("select t.trial_id, t.state, a.value_json from trials t join trial_user_attributes a "
                       "on a.trial_id = t.trial_id where a.key = 'config_key'").fetchall()
    dup = {r[0] for r in con.execute("select trial_id from trial_user_attributes where key = 'duplicate'")}
    fail = {r[0] for r in con.execute("select trial_id from trial_user_attributes where key = 'failure'")}
    con.close()
    return [(tid, st, key) for tid, st, key in rows if tid not in dup and (st == "COMPLETE" or tid in fail)]


def test_pipeline_writes_json_the_loader_returns(tmp_path, monkeypatch):
    path = _run(tmp_path, "--kernels", "decode,prefill", "--decode-buckets", "2", "--prefill-buckets", "3",
                "--trials", "3")
    doc = tuned_store.read_document(path)  # validates the schema
    assert set(doc["tables"]) == {"decode/scalar/fp8/8x1", "prefill/scalar/fp8/8x1"}
    entry = doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
    assert entry["trials"] == 3 and entry["failures"] == 0
    prov = doc["tables"]["decode/scalar/fp8/8x1"]["provenance"]
    assert prov["gpu_name"] == "cpu-interpreter" and "meaningless" in prov["timing"]
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(path.parent))
    choice = get_config("decode", "sm90", "cpu-interpreter", "scalar", "fp8", 8, 1, 2, topk=4)
    assert choice.is_tuned and choice.source == "tuned:exact"
    assert choice.config == LaunchConfig.from_dict(entry["config"])


FAULTS = [
    dict(block_n=32, num_warps=8, num_stages=1, num_splits=2),  # raises
    dict(block_n=32, num_warps=8, num_stages=2, num_splits=2),  # hangs (see tune_faults)
    dict(block_n=128, num_warps=8, num_stages=2, num_splits=2),  # the process dies
    dict(block_n=128, num_warps=4, num_stages=2, num_splits=2),  # computes garbage
    dict(block_n=64, num_warps=2, num_stages=1, num_splits=4),  # fine
]


def test_failing_trials_are_recorded_and_the_study_finishes(tmp_path):
    path = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "10", "--trial-timeout", "15",
                "--runner", "tune_faults:faulty", "--candidates", json.dumps(FAULTS))
    entry = tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
    assert entry["trials"] == 6  # the default plus five candidates, each evaluated once
    assert entry["failures"] == 4
    assert entry["failure_kinds"] == {"error": 1, "timeout": 1, "crash": 1, "wrong_result": 1}
    assert entry["config"] != FAULTS[3] | {"merge_num_warps": 4}, "garbage must never be chosen"


CANDIDATES = [dict(block_n=b, num_warps=w, num_stages=1, num_splits=2) for b in (32, 64) for w in (2, 4, 8)]
REPO = __import__("pathlib").Path(tune.__file__).resolve().parent


def _spawn(tmp_path, delay: float, *extra):
    env = dict(os.environ, TUNE_TEST_DELAY=str(delay),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "interp")]))
    argv = [sys.executable, str(REPO / "tune.py"), *TINY, "--kernels", "decode", "--decode-buckets", "2",
            "--trials", "20", "--heartbeat", "1", "--runner", "tune_faults:slow", "--candidates",
            json.dumps(CANDIDATES), "--out", str(tmp_path / "cfg"), "--storage", f"sqlite:///{tmp_path / 'study.db'}",
            *extra]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _evaluated_keys(db):
    try:
        return [key for _, _, key in _trials(db)]
    except sqlite3.OperationalError:  # tables not created yet
        return []


def test_killed_study_resumes_without_repeating_trials(tmp_path):
    db = tmp_path / "study.db"
    first = _spawn(tmp_path, 1.0)
    deadline = time.time() + 120
    while time.time() < deadline and (not db.exists() or len(_evaluated_keys(db)) < 3):
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the tuner and its trial worker, mid-trial
    first.wait()
    before = _evaluated_keys(db)
    assert 3 <= len(before) < len(CANDIDATES) + 1
    second = _spawn(tmp_path, 0.0)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    after = _evaluated_keys(db)
    assert len(after) == len(set(after)) == len(CANDIDATES) + 1, output  # every config once, the default too
    assert set(before) <= set(after)


def test_two_workers_share_one_sqlite_study(tmp_path):
    db = tmp_path / "study.db"
    procs = [_spawn(tmp_path, 0.5) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    keys = _evaluated_keys(db)
    assert len(keys) == len(set(keys)) == len(CANDIDATES) + 1  # nothing lost, nothing run twice
    con = sqlite3.connect(db)
    tuners = {r[0] for r in con.execute("select value_json from trial_user_attributes where key = 'tuner'")}
    con.close()
    assert len(tuners) == 2, "both workers should have taken trials"
    tuned_store.read_document(tmp_path / "cfg" / "sm90__cpu_interpreter.json")
