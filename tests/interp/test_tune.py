"""The tune pipeline end to end under the interpreter (timings meaningless, the pipeline is real):
JSON written and picked up by the loader, failing trials recorded, resume, shared studies."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import tune
from codegen import get_config, tuned_store
from codegen.configs import LaunchConfig
from codegen.tuning.space import config_key

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


def _tiny_default(kernel: str, tokens: int) -> LaunchConfig:
    """The default config of a TINY bucket (what its study starts from)."""
    from codegen.tuning.buckets import Bucket
    from codegen.tuning.space import default_for

    return default_for(Bucket(kernel, "sm90", "cpu-interpreter", "scalar", "fp8", 8, 1, tokens, 300, head_dim=32,
                              topk=4))


FAULTS = [
    dict(block_n=32, num_warps=8, num_stages=1, num_splits=2),  # raises
    dict(block_n=32, num_warps=8, num_stages=2, num_splits=2),  # hangs (see tune_faults)
    dict(block_n=128, num_warps=8, num_stages=2, num_splits=2),  # the process dies
    dict(block_n=128, num_warps=4, num_stages=2, num_splits=2),  # computes garbage
    dict(block_n=64, num_warps=2, num_stages=1, num_splits=4),  # fine
]


def test_failing_trials_are_recorded_and_the_study_finishes(tmp_path, capsys):
    path = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "10", "--trial-timeout", "15",
                "--runner", "tune_faults:faulty", "--candidates", json.dumps(FAULTS))
    entry = tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
    assert entry["trials"] == 6  # the default plus five candidates, each evaluated once
    assert entry["failures"] == 4
    assert entry["failure_kinds"] == {"error": 1, "timeout": 1, "crash": 1, "wrong_result": 1}
    # Compared as configs (a stored config holds every field): only the default or the fine
    # candidate passed the gate, so only they may be chosen; the garbage one never.
    chosen = config_key(LaunchConfig.from_dict(entry["config"]))
    assert chosen != config_key(LaunchConfig(**FAULTS[3])), "garbage must never be chosen"
    assert chosen in {config_key(_tiny_default("decode", 2)), config_key(LaunchConfig(**FAULTS[4]))}, entry["config"]
    # Each failed trial's log line says why, and so does `msa-tune status`.
    log = capsys.readouterr().out
    assert re.search(r"^  decode/scalar/fp8/8x1@2 trial #\d+: failed \(error\): RuntimeError: injected: this config "
                     r"raises$", log, re.M), log
    assert re.search(r"trial #\d+: failed \(timeout\): no result within 15 s", log), log
    assert tune.main(["status", "--storage", f"sqlite:///{tmp_path / 'study.db'}"]) == 0
    status = capsys.readouterr().out
    assert "      failed: 1 x error: RuntimeError: injected: this config raises" in status, status
    assert "      failed: 1 x timeout: no result within 15 s" in status, status


def test_out_of_memory_is_retried_not_recorded_as_the_configs_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_TEST_MARKERS", str(tmp_path))
    path = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "10",
                "--runner", "tune_faults:oom_once", "--candidates", json.dumps(FAULTS[4:]))
    assert (tmp_path / "oom-64-2").exists(), "the injected out-of-memory never happened"
    entry = tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
    assert entry["trials"] == 2 and entry["failures"] == 0, entry  # the default and the retried candidate


def test_a_bucket_whose_every_trial_ran_out_of_memory_says_so(tmp_path, capsys):
    path = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "3",
                "--runner", "tune_faults:oom_always", "--candidates", json.dumps(FAULTS[4:6]))
    entry = tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
    assert entry["is_default"] and entry["failure_kinds"] == {"out_of_memory": entry["failures"]}, entry
    assert entry["note"].startswith("every trial ran out of GPU memory"), entry
    out = capsys.readouterr()
    assert f"unmeasured decode/scalar/fp8/8x1@2: {entry['note']}" in out.out + out.err  # the run's last lines


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


# --- several workers on one study database (issue 6) ----------------------------------------------
# The run and its checks are shared with the PostgreSQL tests (tests/postgres/multiworker.py);
# here they run on the SQLite default, on one host.
sys.path.insert(0, str(REPO / "tests" / "postgres"))
import multiworker  # noqa: E402


def test_three_workers_one_killed_share_one_sqlite_study(tmp_path):
    """SQLite on one host: three workers, one SIGKILLed mid-trial; every bucket finishes, no config
    runs twice, counts match, the JSON is written once per bucket; status and export agree."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    run = multiworker.three_workers_one_killed(storage, tmp_path)
    multiworker.check(run, tmp_path)
    multiworker.check_status_and_export(storage, tmp_path)


def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connections are refused
    return port


def test_a_database_that_refuses_connections_is_a_clear_error(tmp_path):
    """Refused, at startup and for `status`: retried with backoff, then one line and exit code 3, the
    password hidden, never a traceback."""
    url = f"postgresql+psycopg://tuner:s3cret@127.0.0.1:{_closed_port()}/msa_tune"
    shown = url.replace("s3cret", "***")
    tune_args = [*TINY, "--kernels", "decode", "--decode-buckets", "2", "--trials", "4", "--out", str(tmp_path / "cfg"),
                 "--db-retries", "2", "--db-retry-seconds", "3"]
    # (An SQLite file that cannot be created is a bad --storage, exit 2: test_cli.py.)
    for argv in (tune_args + ["--storage", url],
                 ["status", "--storage", url, "--db-retries", "1", "--db-retry-seconds", "1"]):
        started = time.monotonic()
        proc = multiworker.tune_cli(*argv, timeout=120)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 3, text
        assert "Traceback" not in text and "s3cret" not in text, text
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"msa-tune: cannot reach the study database at {shown}"), last
        assert "refused" in last.lower(), last
        assert "retry 1/" in proc.stderr, proc.stderr
        assert time.monotonic() - started < 60
    assert not (tmp_path / "cfg" / "sm90__cpu_interpreter.json").exists()


_POP = """
import json, sys, optuna
from codegen.tuning.storage import open_storage
study = optuna.load_study(study_name="pop", storage=open_storage(sys.argv[1], 10))
print(json.dumps([study.ask()._trial_id for _ in range(40)]))
"""


def test_queued_trials_are_popped_once_by_concurrent_sqlite_workers(tmp_path):
    """Plain Optuna on SQLite lets two processes pop the same queued trial (pysqlite reads it as
    WAITING before taking the write lock); open_storage's storage takes the lock first."""
    import optuna

    url = f"sqlite:///{tmp_path / 'pop.db'}"
    study = optuna.create_study(study_name="pop", storage=url)
    for i in range(160):
        study.enqueue_trial({"x": i})
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _POP, url], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    popped = [i for p in procs for i in json.loads(p.communicate(timeout=120)[0])]
    assert len(popped) == len(set(popped)) == 120


def test_trials_beat_from_the_start_and_orphans_are_failed_and_queued_again(tmp_path, monkeypatch):
    """A trial has a heartbeat from the transaction that makes it RUNNING, so a worker killed right
    after asking still leaves a trial that goes stale. One asked without that (another client) and
    never beaten is an orphan Optuna would never fail: after a while it is failed and queued again."""
    import optuna
    import sqlalchemy as sa

    from codegen.tuning import heartbeats
    from codegen.tuning.records import key_of
    from codegen.tuning.settings import TuneSettings
    from codegen.tuning.state import TunerState

    url = f"sqlite:///{tmp_path / 's.db'}"
    state = TunerState(TuneSettings(storage=url, heartbeat_s=1), log=lambda _: None)
    try:
        study = optuna.create_study(study_name="orphans", storage=state.storage)
        fresh = study.ask()  # a new trial
        for block_n in (64, 32):
            study.enqueue_trial({"block_n": block_n})
        popped = study.ask()  # the queued block_n=64
        with state.storage.engine.connect() as conn:
            beating = set(conn.execute(sa.text("select trial_id from trial_heartbeats")).scalars())
        assert beating == {popped._trial_id, fresh._trial_id}  # no explicit beat was recorded
        plain = optuna.load_study(study_name="orphans", storage=optuna.storages.RDBStorage(url))
        orphan = plain.ask()  # the queued block_n=32, popped by a client without the first beat
        heartbeats.fail_orphans(study, study.get_trials(deepcopy=False), state.storage, state.db)
        assert study.get_trials()[orphan.number].state.name == "RUNNING"  # not old enough yet
        monkeypatch.setattr(heartbeats, "ORPHAN_S", -1)
        heartbeats.fail_orphans(study, study.get_trials(deepcopy=False), state.storage, state.db)
        trials = study.get_trials()
        assert [t.state.name for t in trials] == ["RUNNING", "RUNNING", "FAIL", "WAITING"]
        assert trials[2].number == orphan.number
        assert key_of(trials[3]) == key_of(trials[2]) is not None  # queued again, same config
    finally:
        state.close()


def test_studies_are_seeded_with_the_neighbouring_buckets_winners(tmp_path):
    """A new bucket's study queues the default, then the configs chosen for the nearest buckets of
    the same table (read from the file this run writes); points outside its space are skipped."""
    import optuna

    from codegen.tuning.buckets import Bucket
    from codegen.tuning.publish import Publisher
    from codegen.tuning.seeding import seed
    from codegen.tuning.space import config_key, default_for, enumerate_space

    first = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "2")
    doc = tuned_store.read_document(first)
    table = doc["tables"]["decode/scalar/fp8/8x1"]
    chosen = LaunchConfig(block_n=32, num_warps=8, num_stages=1, num_splits=4, fused_merge=1, kv_upcast=2)
    far = LaunchConfig(block_n=128, num_warps=2, num_stages=1, num_splits=2)
    table["buckets"]["2"].update(config=chosen.to_dict(), is_default=False)
    table["buckets"]["64"] = dict(table["buckets"]["2"], config=far.to_dict())
    table["buckets"]["16"] = dict(table["buckets"]["2"], config=LaunchConfig().to_dict(), is_default=True)
    tuned_store.write_document(first, doc)

    bucket = Bucket(arch="sm90", device="cpu-interpreter", kernel="decode", scale_mode="scalar", kv_dtype="fp8",
                    num_q_heads=8, num_kv_heads=1, tokens=4, head_dim=32, topk=4, context=300, pattern="correlated")
    neighbours = Publisher(first, "sm90", "cpu-interpreter", {}, [], True, {}).neighbours(bucket)
    assert neighbours == [chosen, far], "nearest in log2 tokens first; the default-keeping bucket is skipped"

    space = enumerate_space("sm90", "decode", num_q_heads=8, num_kv_heads=1, topk=4, kv_dtype="fp8")
    study = optuna.create_study()
    seed(study, bucket, {config_key(c) for c in space} - {config_key(far)}, lambda: neighbours)
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]
    assert len(queued) == 2  # `far` is outside this (restricted) space
    assert queued[0]["block_n"] == default_for(bucket).block_n
    assert queued[1] == {"block_n": 32, "num_warps": 8, "num_stages": 1, "num_splits": 4, "fused_merge": 1,
                         "kv_upcast": 2, "kv_tma": 1, "v_early": 0}  # v_early: asked at num_stages 1
    seed(study, bucket, {config_key(c) for c in space}, lambda: neighbours)
    assert len(study.get_trials(deepcopy=False)) == 2, "a study is seeded once"


def test_seed_from_a_tuned_file_puts_its_configs_first(tmp_path):
    """--seed-from: after the default, a study first tries the other file's configs for its table."""
    first = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "1")
    doc = tuned_store.read_document(first)
    seeded = dict(block_n=32, num_warps=2, num_stages=1, num_splits=2, fused_merge=1)
    doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]["config"] = LaunchConfig(**seeded).to_dict()
    seed_file = tmp_path / "old.json"
    tuned_store.write_document(seed_file, doc)
    out = tmp_path / "cfg2"
    argv = TINY + ["--out", str(out), "--storage", f"sqlite:///{tmp_path / 'study2.db'}", "--kernels", "decode",
                   "--decode-buckets", "2", "--trials", "2", "--seed-from", str(seed_file)]
    assert tune.main(argv) == 0
    keys = [json.loads(key) for _, _, key in sorted(_trials(tmp_path / "study2.db"))]  # trial order
    assert len(keys) == 2
    assert keys[1] == config_key(LaunchConfig(**seeded))


def test_a_re_tune_starts_from_the_table_it_replaces(tmp_path):
    """--seed-from auto (the default): the file this run writes, when it exists, seeds its studies;
    'none' turns that off."""
    first = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "1")
    doc = tuned_store.read_document(first)
    seeded = dict(block_n=32, num_warps=2, num_stages=1, num_splits=2, fused_merge=1)
    doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]["config"] = LaunchConfig(**seeded).to_dict()
    tuned_store.write_document(first, doc)
    for seed_from, db in (("auto", "auto.db"), ("none", "none.db")):
        argv = TINY + ["--out", str(first.parent), "--storage", f"sqlite:///{tmp_path / db}", "--kernels", "decode",
                       "--decode-buckets", "2", "--trials", "2", "--seed-from", seed_from]
        assert tune.main(argv) == 0
        keys = [json.loads(key) for _, _, key in sorted(_trials(tmp_path / db))]  # trial order
        assert (keys[1] == config_key(LaunchConfig(**seeded))) == (seed_from == "auto"), (seed_from, keys)


def test_a_first_tune_of_a_borrowing_gpu_starts_from_the_borrowed_table(tmp_path, monkeypatch, capsys):
    """--seed-from auto with no file of its own yet: a GPU that borrows a table (an H100 the H200's;
    here the interpreter, mapped for the test) seeds its studies with the configs it ran until now."""
    first = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "1")
    doc = tuned_store.read_document(first)
    seeded = dict(block_n=32, num_warps=2, num_stages=1, num_splits=2, fused_merge=1)
    doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]["config"] = LaunchConfig(**seeded).to_dict()
    doc["device"] = "NVIDIA_H200"
    lender_dir = tmp_path / "lender"
    lender_dir.mkdir()
    tuned_store.write_document(lender_dir / "sm90__NVIDIA_H200.json", doc)
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(lender_dir))
    monkeypatch.setitem(tuned_store.BORROWED_TABLES, ("sm90", "cpu_interpreter"), "NVIDIA_H200")
    argv = TINY + ["--out", str(tmp_path / "fresh"), "--storage", f"sqlite:///{tmp_path / 'b.db'}", "--kernels",
                   "decode", "--decode-buckets", "2", "--trials", "2"]
    assert tune.main(argv) == 0
    assert "seeds from " + str(lender_dir / "sm90__NVIDIA_H200.json") in capsys.readouterr().out
    keys = [json.loads(key) for _, _, key in sorted(_trials(tmp_path / "b.db"))]  # trial order
    assert keys[1] == config_key(LaunchConfig(**seeded)), keys
    # Once it has a file of its own, that file's tables seed their studies, not the lender's.
    own_file = tmp_path / "fresh" / tuned_store.file_name("sm90", "cpu-interpreter")
    own = tuned_store.read_document(own_file)
    mine = dict(block_n=64, num_warps=4, num_stages=3, num_splits=4, fused_merge=0)
    own["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]["config"] = LaunchConfig(**mine).to_dict()
    tuned_store.write_document(own_file, own)
    argv[argv.index(f"sqlite:///{tmp_path / 'b.db'}")] = f"sqlite:///{tmp_path / 'c.db'}"
    assert tune.main(argv) == 0
    keys = [json.loads(key) for _, _, key in sorted(_trials(tmp_path / "c.db"))]
    assert keys[1] == config_key(LaunchConfig(**mine)), keys


def _studied_buckets(db) -> set[str]:
    con = sqlite3.connect(db)
    names = [row[0] for row in con.execute("select study_name from studies")]
    con.close()
    return {name.split(":")[2] for name in names}  # arch:device:label:...


def test_skip_published_resumes_from_the_table_without_its_database(tmp_path, capsys):
    """--skip-published: a bucket the file already holds, measured here with these kernels, Triton and
    workload, is left out even with a fresh study database; one whose trials ran out of GPU memory, or
    measured under another workload, is tuned again."""
    first = _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "1")
    capsys.readouterr()

    def again(db, *extra):
        argv = TINY + ["--out", str(first.parent), "--storage", f"sqlite:///{tmp_path / db}", "--kernels", "decode",
                       "--decode-buckets", "2,4", "--trials", "1", "--skip-published", *extra]
        assert tune.main(argv) == 0
        return _studied_buckets(tmp_path / db), capsys.readouterr().out

    studied, out = again("fresh.db")
    assert studied == {"decode/scalar/fp8/8x1@4"} and "1 of 2 buckets already in" in out, (studied, out)
    doc = tuned_store.read_document(first)
    doc["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]["failure_kinds"] = {"out_of_memory": 3}
    tuned_store.write_document(first, doc)
    studied, out = again("after_oom.db")
    assert studied == {"decode/scalar/fp8/8x1@2"} and "1 of 2 buckets already in" in out, (studied, out)
    studied, _ = again("other_context.db", "--decode-context", "400")  # another workload: both tuned
    assert studied == {"decode/scalar/fp8/8x1@2", "decode/scalar/fp8/8x1@4"}


def test_seed_from_an_unreadable_file_is_a_clear_error(tmp_path, capsys):
    assert tune.main(TINY + ["--kernels", "decode", "--seed-from", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("msa-tune: --seed-from: cannot read ")


def _study_trials(db, marker: str):
    """(params, config) of the evaluated trials of the studies whose name holds `marker`."""
    con = sqlite3.connect(db)
    ids = [r[0] for r in con.execute("select t.trial_id from trials t join studies s on s.study_id = t.study_id "
                                     "where s.study_name like ?", (f"%{marker}%",))]
    evaluated = {tid for tid, _, _ in _trials(db)}
    out = []
    for tid in ids:
        if tid not in evaluated:
            continue
        params = {r[0] for r in con.execute("select param_name from trial_params where trial_id = ?", (tid,))}
        config = json.loads(con.execute("select value_json from trial_user_attributes where trial_id = ? and "
                                        "key = 'config'", (tid,)).fetchone()[0])
        out.append((params, config))
    con.close()
    return out


def test_the_per_token_study_writes_its_sub_entry_and_leaves_the_tiled_entry(tmp_path):
    """A prefill bucket's second study: block_t 1 (not searched), unrelated selections after a
    prefix of 4 x topk pages, its own study; its result goes into the bucket's per_token sub-entry
    and the tiled entry stays as its own study wrote it. --prefill-paths tiled runs no such study."""
    from codegen.tuning import status
    from codegen.tuning.storage import open_storage

    path = _run(tmp_path, "--kernels", "prefill", "--prefill-buckets", "3", "--trials", "2",
                "--prefill-paths", "tiled")
    tiled_only = tuned_store.read_document(path)["tables"]["prefill/scalar/fp8/8x1"]["buckets"]["3"]
    assert "per_token" not in tiled_only and not _study_trials(tmp_path / "study.db", ":per_token")
    path = _run(tmp_path, "--kernels", "prefill", "--prefill-buckets", "3", "--trials", "2")  # both paths
    entry = tuned_store.read_document(path)["tables"]["prefill/scalar/fp8/8x1"]["buckets"]["3"]
    sub = entry.pop("per_token")
    assert entry == tiled_only, "the per-token study must not touch the tiled entry"
    assert sub["trials"] == 2 and sub["failures"] == 0 and sub["config"]["block_t"] == 1
    assert sub["workload"] == {"pattern": "random", "prefill_prefix": 4 * 4 * 128}
    assert ":per_token:ctx2048:random:" in sub["study"] and sub["study"] != entry["study"]
    trials = _study_trials(tmp_path / "study.db", ":per_token")
    assert len(trials) == 2
    assert all("block_t" not in params and config["block_t"] == 1 for params, config in trials), trials
    # export rebuilds the same file from the studies, sub-entry included
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        status.export(storage, tmp_path / "exported", log=lambda _: None)
    finally:
        storage.engine.dispose()
    exported = tuned_store.read_document(tmp_path / "exported" / path.name)["tables"]["prefill/scalar/fp8/8x1"]
    assert exported["buckets"]["3"] == dict(entry, per_token=sub)


def test_patience_stops_a_search_that_finds_nothing_better(tmp_path):
    """--patience 3: the default is never beaten, so the study stops after it and 3 more trials of
    the 6 candidates; without --patience all 7 are measured."""
    candidates = [dict(block_n=b, num_warps=w, num_stages=1, num_splits=2) for b in (32, 128) for w in (2, 4, 8)]
    argv = ("--kernels", "decode", "--decode-buckets", "2", "--trials", "10", "--runner",
            "tune_faults:slower_than_the_default", "--candidates", json.dumps(candidates))
    for extra, trials in ((("--patience", "3"), 4), ((), 7)):
        run_dir = tmp_path / ("patience" if extra else "all")
        run_dir.mkdir()
        entry = tuned_store.read_document(_run(run_dir, *argv, *extra))["tables"]["decode/scalar/fp8/8x1"]["buckets"]["2"]
        assert entry["trials"] == trials, (extra, entry)
        assert entry["is_default"]


def test_later_buckets_of_a_table_measure_only_the_leaders_of_its_full_searches(tmp_path):
    """--full-search 1 --leaders 2: the first bucket of the grid's order (2 requests) searches the
    whole space; the two later ones (8, then 4) measure only the default and that study's two fastest
    configs, and pick the fastest of those. --full-search all: every bucket searches."""
    import optuna

    from codegen.tuning.transfer import study_leaders

    argv = ("--kernels", "decode", "--decode-buckets", "2,4,8", "--trials", "6", "--runner", "tune_faults:timed_by_config")
    path = _run(tmp_path, *argv, "--full-search", "1", "--leaders", "2")
    buckets = tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    studies = {s.study_name.split("@")[1].split(":")[0]: s.study_name for s in optuna.get_all_study_summaries(storage)}
    trials = {n: optuna.load_study(study_name=name, storage=storage).get_trials() for n, name in studies.items()}
    assert len([t for t in trials["2"] if t.state.is_finished() and not t.user_attrs.get("duplicate")]) == 6
    leaders = study_leaders(trials["2"], 2)
    assert len(leaders) == 2
    for n in ("4", "8"):
        measured = [t for t in trials[n] if t.state == optuna.trial.TrialState.COMPLETE]
        default_key = min(measured, key=lambda t: t.number).user_attrs["config_key"]  # trial 0: the default
        keys = {t.user_attrs["config_key"] for t in measured}
        assert keys <= {config_key(c) for c in leaders} | {default_key} and len(keys) >= 2, (n, keys)
        assert buckets[n]["trials"] == len(measured)
        assert LaunchConfig.from_dict(buckets[n]["config"]) == leaders[0], "the fastest leader wins"
    every = tmp_path / "all"
    every.mkdir()
    buckets = tuned_store.read_document(_run(every, *argv, "--full-search", "all"))["tables"]["decode/scalar/fp8/8x1"]["buckets"]
    assert all(buckets[n]["trials"] == 6 for n in ("2", "4", "8"))


def test_full_search_and_leaders_are_checked(capsys):
    for extra, named in ((("--full-search", "0"), "--full-search"), (("--full-search", "some"), "--full-search"),
                         (("--leaders", "0"), "--leaders")):
        assert tune.main(TINY + ["--list", *extra]) == 2
        assert named in capsys.readouterr().err


def test_the_time_account_splits_the_trials_by_phase(tmp_path, capsys):
    """The run's last lines say where the trials' time went, phase by phase (trial.PHASES), and the
    phases add up to the trials' wall time (the rest is the worker process)."""
    _run(tmp_path, "--kernels", "decode", "--decode-buckets", "2", "--trials", "2")
    out = capsys.readouterr().out.splitlines()
    header = next(l for l in out if l.startswith("bucket "))
    row = next(l for l in out if l.startswith("decode/scalar/fp8/8x1@2 ")).split()
    assert header.split()[header.split().index("seconds") - 1] == "failed" and float(row[-2]) > 0, (header, row)
    line = next(l for l in out if l.startswith("msa-tune: trials "))
    total, parts = re.fullmatch(r"msa-tune: trials (\d+) s = (.*)", line).groups()
    seconds = dict((name, int(s)) for s, name in ((p.split(" s")[0].rsplit(" ", 1)[1], p.rsplit(" ", 2)[0])
                                                 for p in parts.split(" + ")))
    assert set(seconds) == {"inputs and reference", "first launch and accuracy check", "eager runs and graph capture",
                            "worker process"}, line
    assert abs(sum(seconds.values()) - int(total)) <= len(seconds), line


def test_a_slow_compile_holds_up_only_its_own_candidate(tmp_path):
    """Candidates are prepared `precompile_workers` at a time and run as each is ready: while the
    first one (the default) takes two seconds to prepare, the next ones are prepared and measured, and
    the freed slots take new candidates. Every candidate is measured once."""
    from concurrent.futures import ThreadPoolExecutor

    from codegen.tuning.buckets import Bucket
    from codegen.tuning.preparer import Preparer
    from codegen.tuning.settings import TuneSettings
    from codegen.tuning.state import TunerState
    from codegen.tuning.study import tune_bucket
    from codegen.tuning.worker import TrialWorker

    class SlowFirst:
        def __init__(self):
            self.pool, self.submitted = ThreadPoolExecutor(3), 0

        def submit(self, request):
            delay = 2.0 if self.submitted == 0 else 0.0
            self.submitted += 1
            return self.pool.submit(lambda: (time.sleep(delay), ([], {}))[1])

        first_done = staticmethod(Preparer.first_done)

        def result(self, future):
            return future.result()[0]

    candidates = [LaunchConfig(block_n=b, num_warps=w, num_stages=1, num_splits=2) for b in (32, 128) for w in (2, 4, 8)]
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'study.db'}", trials=10, precompile_workers=3,
                            candidates=candidates, runner="tune_faults:timed_by_config")
    state, worker = TunerState(settings, log=lambda line: None), TrialWorker(settings.runner)
    bucket = Bucket("decode", "sm90", "cpu-interpreter", "scalar", "fp8", 8, 1, 2, 300, head_dim=32, topk=4)
    try:
        assert worker.run(settings.request(bucket, candidates[0]), 60)["ok"]  # started: its start-up is not timed
        result = tune_bucket(bucket, "slow-first", settings, worker, SlowFirst(), log=lambda line: None, state=state)
    finally:
        worker.close()
        state.close()
    import optuna

    trials = [t for t in optuna.load_study(study_name="slow-first", storage=settings.storage).get_trials()
              if t.state == optuna.trial.TrialState.COMPLETE]
    assert result.trials == 7 and len({t.user_attrs["config_key"] for t in trials}) == 7
    first = min(trials, key=lambda t: t.number)
    assert sum(t.datetime_complete < first.datetime_complete for t in trials) >= 2, "the others did not wait for it"


def test_the_gpu_lock_is_held_in_turn_across_processes(tmp_path):
    """gpu_lock.held: a second process waits until the first lets go (the trial worker and the
    preparers take the run's GPU in turn)."""
    from codegen.tuning.gpu_lock import held, new_lock_path, remove_lock

    path = new_lock_path()
    waiter = [sys.executable, "-c", "import sys, time; from codegen.tuning.gpu_lock import held; t = time.time()\n"
              "with held(sys.argv[1]): print(time.time() - t)", path]
    try:
        with held(path):
            child = subprocess.Popen(waiter, stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
                                     env=dict(os.environ, PYTHONPATH=os.getcwd()))
            time.sleep(1.5)
        waited = float(child.communicate(timeout=60)[0])
        assert waited > 1.0, waited
        with held(None):  # no lock: a no-op
            pass
    finally:
        remove_lock(path)
    assert not os.path.exists(path)


def test_a_candidate_whose_jit_compile_is_over_the_limit_is_dropped():
    """On a GPU the gate reads the JIT's kernels; their compile time is judged like the AOT one."""
    from codegen.static import COMPILE_SECONDS_LIMIT
    from codegen.tuning.trial import _slow_compile

    assert _slow_compile(COMPILE_SECONDS_LIMIT * 2 - 1, 2) == []  # two kernels: twice the time
    (problem,) = _slow_compile(COMPILE_SECONDS_LIMIT + 1, 1)
    assert problem.startswith("compile time") and f"limit {COMPILE_SECONDS_LIMIT:g} s" in problem
