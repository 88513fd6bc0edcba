"""msa-tune's command line: a bad argument is refused with exit code 2 and one line naming it,
before any study, database or file exists; --list needs no GPU; defaults do not depend on the
working directory; status is sorted by tokens; checks fail closed. (The pipeline itself:
test_tune.py.)"""
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

import tune
from codegen import tuned_store

REPO = pathlib.Path(tune.__file__).resolve().parent
TINY = ["--interpret", "--arch", "sm90", "--kernels", "decode", "--modes", "scalar:fp8", "--layouts", "tp8",
        "--decode-buckets", "2", "--head-dim", "32", "--topk", "4", "--decode-context", "300"]

BAD = [
    (["--trials", "-5"], "msa-tune: --trials: expected an integer >= 1, got -5"),
    (["--trials", "0"], "msa-tune: --trials: expected an integer >= 1, got 0"),
    (["--head-dim", "33"], "msa-tune: --head-dim: expected a power of two >= 16, got 33"),
    (["--head-dim", "8"], "msa-tune: --head-dim: expected a power of two >= 16, got 8"),
    (["--arch", "sm80"], "msa-tune: --arch: expected auto or one of ['gfx942', 'sm90'], got 'sm80'"),
    (["--arch", "sm80", "--list"], "msa-tune: --arch: expected auto or one of ['gfx942', 'sm90'], got 'sm80'"),
    (["--arch", "auto"], "msa-tune: --arch: --interpret runs no GPU to detect the arch from: give one of "
                         "['gfx942', 'sm90']"),
    (["--topk", "0"], "msa-tune: --topk: expected an integer >= 1, got 0"),
    (["--heartbeat", "0"], "msa-tune: --heartbeat: expected an integer >= 1, got 0"),
    (["--patience", "0"], "msa-tune: --patience: expected an integer >= 1, got 0"),
    (["--db-retries", "-1"], "msa-tune: --db-retries: expected an integer >= 0, got -1"),
    (["--trial-timeout", "0"], "msa-tune: --trial-timeout: expected a number > 0, got 0.0"),
    (["--kernels", "attention"], "msa-tune: --kernels: expected a comma list of prefill, decode; got 'attention'"),
    (["--layouts", "tp3"], "msa-tune: --layouts: expected names from ['tp1', 'tp2', 'tp4', 'tp8'], got 'tp3'"),
    (["--candidates", "{"], "msa-tune: --candidates: not JSON"),
    (["--candidates", "3"], "msa-tune: --candidates: expected a JSON list of configs, or an object of such lists by table"),
    (["--candidates", "@/no/such/candidates.json"], "msa-tune: --candidates: cannot read '/no/such/candidates.json'"),
    (["--kernels", "decode", "--layouts", "tp4", "--candidates", '{"decode/scalar/fp8/64x4": []}'],
     "msa-tune: --candidates: table(s) ['decode/scalar/fp8/64x4'] are not in this run's grid"),
    (["--kernels", "decode", "--layouts", "tp4", "--candidates", '{"decode/scalar/fp8/16x1": [], "decode/scalar/fp8/12x1": []}'],
     "msa-tune: --candidates: ['decode/scalar/fp8/12x1'] name no table"),
    # A candidate the studies cannot run as given: refused up front, not by a crash mid-run.
    (["--kernels", "prefill", "--layouts", "tp4", "--candidates", '[{"block_t": 16}]'],
     "msa-tune: --candidates[0] for prefill/scalar/fp8/16x1: block_t=16 is outside the prefill search space"),
    (["--kernels", "prefill", "--modes", "none:bf16", "--layouts", "tp4", "--candidates",
      '{"prefill/none/bf16/16x1": [{"kv_upcast": 2}]}'],
     "msa-tune: --candidates['prefill/none/bf16/16x1'][0] for prefill/none/bf16/16x1: kv_upcast=2 is not searched"),
    (["--kernels", "decode", "--layouts", "tp4", "--candidates", '[{"num_splits": 32}]'],
     "msa-tune: --candidates[0] for decode/scalar/fp8/16x1: config.num_splits: expected [1, topk=4], got 32"),
    (["--prefill-paths", "tiled,tiles"], "msa-tune: --prefill-paths: expected a comma list of tiled, per_token; "
                                         "got 'tiled,tiles'"),
    (["--storage", "not a url"], "msa-tune: --storage: not a database URL SQLAlchemy understands"),
    (["--trials", "many"], "msa-tune: argument --trials: invalid int value: 'many' (see msa-tune --help)"),
]


def _argv(tmp_path, *extra):
    """TINY (--interpret --arch sm90 ...) with `extra` last, so it overrides; into tmp_path only."""
    return [*TINY, "--out", str(tmp_path / "cfg"), "--storage", f"sqlite:///{tmp_path / 'db' / 'study.db'}", *extra]


@pytest.mark.parametrize("extra,line", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_one_line_and_exit_code_2_before_anything_is_touched(tmp_path, capsys, extra, line):
    code = tune.main(_argv(tmp_path, *extra))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith(line), err
    assert out == ""
    assert list(tmp_path.iterdir()) == [], "nothing may be created for a refused command"


def test_a_candidate_list_is_narrowed_to_the_runs_tables(tmp_path, capsys, monkeypatch):
    """A list of every table (codegen/tuning/candidates/) with --modes: the other modes' tables are left
    out, with a note; the run's own keep their configs."""
    ran = []
    monkeypatch.setattr(tune, "_device", lambda args: ("sm90", "NVIDIA H200"))
    monkeypatch.setattr(tune, "_tune", lambda args, argv, arch, device_name: ran.append(args.candidates) or 0)
    listed = {"prefill/none/bf16/16x1": [{"block_t": 4, "block_n": 64}], "prefill/scalar/fp8/16x1": [{"block_t": 2}]}
    code = tune.main(["--kernels", "prefill", "--layouts", "tp4", "--modes", "none:bf16", "--out", str(tmp_path / "cfg"),
                      "--storage", f"sqlite:///{tmp_path / 'db' / 'study.db'}", "--candidates", json.dumps(listed)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "leaving out 1 table(s) outside this run's grid" in err and "prefill/scalar/fp8/16x1" in err
    assert [list(c) for c in ran] == [["prefill/none/bf16/16x1"]]


def test_trials_default_to_every_candidate(tmp_path, capsys, monkeypatch):
    """With --candidates and no --trials, every study measures its whole list: the longest list of the
    run's tables plus the default (a list longer than --trials would be sampled). A smaller --trials is
    kept, with a note; without --candidates the default stays 40."""
    monkeypatch.setattr(tune, "_device", lambda args: ("sm90", "NVIDIA H200"))
    trials = []
    monkeypatch.setattr(tune, "_tune", lambda args, argv, arch, device_name: trials.append(args.trials) or 0)
    common = ["--kernels", "decode", "--layouts", "tp4", "--modes", "scalar:fp8,per_token_head:fp8",
              "--out", str(tmp_path / "cfg"), "--storage", f"sqlite:///{tmp_path / 'db' / 'study.db'}"]
    by_table = {"decode/scalar/fp8/16x1": [{"num_splits": s} for s in (1, 2)],
                "decode/per_token_head/fp8/16x1": [{"num_splits": s} for s in (1, 2, 4)],
                "decode/scalar/fp8/64x4": [{"num_splits": s} for s in (1, 2, 3, 4)]}  # outside the run: not counted
    assert tune.main([*common, "--candidates", json.dumps(by_table)]) == 0
    assert tune.main([*common, "--candidates", '[{"num_splits": 2}]']) == 0
    assert tune.main(common) == 0
    capsys.readouterr()
    assert tune.main([*common, "--candidates", json.dumps(by_table), "--trials", "2"]) == 0
    assert "--trials 2 is below the 3 candidates of the longest list" in capsys.readouterr().err
    assert trials == [4, 2, 40, 2]


def test_candidates_are_checked_for_the_arch_the_gpu_names(tmp_path, capsys, monkeypatch):
    # --arch auto (the default on a GPU): the candidates are checked once the device gives the arch,
    # still before anything is touched. The H200 run of 2026-12-01 was refused for arch 'auto'.
    monkeypatch.setattr(tune, "_device", lambda args: ("sm90", "NVIDIA H200"))
    ran = []
    monkeypatch.setattr(tune, "_tune", lambda args, argv, arch, device_name: ran.append(arch) or 0)
    common = ["--kernels", "prefill", "--layouts", "tp4", "--out", str(tmp_path / "cfg"),
              "--storage", f"sqlite:///{tmp_path / 'db' / 'study.db'}"]
    assert tune.main([*common, "--candidates", '[{"block_t": 4, "block_n": 64}]']) == 0 and ran == ["sm90"]
    capsys.readouterr()
    assert tune.main([*common, "--candidates", '[{"block_t": 16}]']) == 2 and ran == ["sm90"]
    assert capsys.readouterr().err.startswith("msa-tune: --candidates[0] for prefill/scalar/fp8/16x1: block_t=16 is "
                                              "outside the prefill search space")
    assert list(tmp_path.iterdir()) == []
    # @FILE: the same list read from a file (the tuned file's provenance then names the file).
    listed = tmp_path / "candidates.json"
    listed.write_text('[{"block_t": 4, "block_n": 64}]')
    assert tune.main([*common, "--candidates", f"@{listed}"]) == 0 and ran == ["sm90", "sm90"]


def test_interpret_without_an_arch_is_refused(tmp_path, capsys):
    code = tune.main(["--interpret", "--list", "--out", str(tmp_path / "cfg")])
    assert code == 2
    assert capsys.readouterr().err == ("msa-tune: --arch: --interpret runs no GPU to detect the arch from: give one "
                                       "of ['gfx942', 'sm90']\n")


def test_write_defaults_without_an_arch_is_refused(tmp_path, capsys):
    assert tune.main(["--write-defaults", "AMD Instinct MI300X", "--out", str(tmp_path / "cfg")]) == 2
    assert capsys.readouterr().err == "msa-tune: --arch: --write-defaults needs one of ['gfx942', 'sm90']\n"
    assert not (tmp_path / "cfg").exists()


def test_the_command_line_process_exits_2_with_one_line(tmp_path):
    """The same through a real process, as a user runs it (exit status, nothing on stdout)."""
    proc = subprocess.run([sys.executable, str(REPO / "tune.py"), "--interpret", "--arch", "sm80", "--list"],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert proc.stderr == "msa-tune: --arch: expected auto or one of ['gfx942', 'sm90'], got 'sm80'\n"
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_list_needs_no_gpu_and_touches_nothing(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert tune.main(["--list", "--kernels", "decode", "--decode-buckets", "1,128,16", "--layouts", "tp8"]) == 0
    out = capsys.readouterr().out
    assert "no GPU here" in out and f"{REPO / 'tuned_configs'}/<arch>__<DEVICE>.json" in out
    assert [line.strip() for line in out.splitlines() if line.startswith("  ")] == [
        f"decode/{mode}/{kv}/8x1@{n}" for n in (1, 128, 16) for mode, kv in
        (("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16"))]
    assert list(tmp_path.iterdir()) == []
    # Without --list there is nothing to tune on: exit 1, one line.
    assert tune.main(["--kernels", "decode"]) == 1
    assert capsys.readouterr().err.startswith("msa-tune: no GPU found.")


@pytest.mark.parametrize("gpu,borrows", [("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", False)])
def test_list_says_whose_tables_a_gpu_runs_until_tuned(gpu, borrows, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tune, "_device", lambda args: ("sm90", gpu))
    monkeypatch.chdir(tmp_path)
    assert tune.main(["--list", "--kernels", "decode", "--decode-buckets", "1", "--layouts", "tp8"]) == 0
    out = capsys.readouterr().out
    assert ("until then this GPU runs NVIDIA_H200's tables" in out) == borrows, out
    assert list(tmp_path.iterdir()) == []


def test_list_shows_the_per_token_buckets_after_the_tiled_ones_of_each_step(tmp_path, capsys):
    listed = lambda: [line.strip() for line in capsys.readouterr().out.splitlines()  # noqa: E731
                      if line.startswith("  ")]
    # More than a smoke run under --interpret: --list shows it all the same (it runs nothing).
    argv = [*TINY, "--list", "--kernels", "prefill", "--prefill-buckets", "512,8192,2048", "--out", str(tmp_path)]
    assert tune.main(argv) == 0
    assert listed() == [f"prefill/scalar/fp8/8x1@{n}{path}" for n in (512, 8192, 2048) for path in ("", ":per_token")]
    assert tune.main([*argv, "--prefill-paths", "tiled"]) == 0
    assert listed() == [f"prefill/scalar/fp8/8x1@{n}" for n in (512, 8192, 2048)]
    assert tune.main([*argv, "--prefill-paths", "per_token"]) == 0
    assert listed() == [f"prefill/scalar/fp8/8x1@{n}:per_token" for n in (512, 8192, 2048)]


def test_per_token_buckets_time_unrelated_selections_after_a_long_prefix():
    from codegen.tuning.buckets import grid

    common = dict(arch="sm90", device="X", kernels=["prefill"], modes=[("scalar", "fp8")], layouts=["tp8"],
                  decode_buckets=[1], prefill_buckets=[512], decode_context=1, pattern="correlated",
                  prefill_paths=["tiled", "per_token"], topk=16)
    tiled, per_token = grid(prefill_prefix=200, **common)
    assert (tiled.path, tiled.pattern, tiled.context) == ("tiled", "correlated", 200)
    assert (per_token.path, per_token.pattern, per_token.context) == ("per_token", "random", 16 * 128 * 4)
    assert grid(prefill_prefix=20000, **common)[1].context == 20000  # a longer prefix stays


def test_the_study_database_defaults_to_the_repo_not_the_working_directory(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert tune.main(["--arch", "sm90", "--kernels", "decode", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"studies in sqlite:///{REPO / 'tune_studies' / 'sm90__<DEVICE>.db'}\n" in out, out
    assert f"this writes {REPO / 'tuned_configs' / 'sm90__<DEVICE>.json'} " in out, out
    assert list(tmp_path.iterdir()) == []


def test_status_finds_the_repo_study_file_from_anywhere(tmp_path, capsys, monkeypatch):
    from codegen.tuning import status
    from codegen.tuning.storage import open_storage

    studies = tmp_path / "repo_studies"
    studies.mkdir()
    open_storage(f"sqlite:///{studies / 'sm90__NVIDIA_H200.db'}").engine.dispose()  # an empty study file
    monkeypatch.setattr(status, "STUDY_DIR", studies)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tune_studies").mkdir(parents=True)
    for name in ("a.db", "b.db"):  # what a lookup in the working directory would find
        (elsewhere / "tune_studies" / name).write_text("")
    monkeypatch.chdir(elsewhere)
    assert tune.main(["status"]) == 0
    assert f"msa-tune status: sqlite:///{studies / 'sm90__NVIDIA_H200.db'}: 0 bucket studies" in capsys.readouterr().out
    monkeypatch.setattr(status, "STUDY_DIR", elsewhere / "tune_studies")
    assert tune.main(["status"]) == 2
    assert capsys.readouterr().err.startswith("msa-tune: --storage: needed unless ")


def test_status_sorts_buckets_by_token_count(tmp_path, capsys):
    import optuna

    from codegen.tuning.buckets import Bucket

    url = f"sqlite:///{tmp_path / 'study.db'}"
    for tokens in (128, 16, 1, 2):
        bucket = Bucket("decode", "sm90", "NVIDIA_H200", "scalar", "fp8", 8, 1, tokens, 8192)
        optuna.create_study(study_name=bucket.study_name("abc", "3.6.0"), storage=url)
    assert tune.main(["status", "--storage", url]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  decode/")]
    assert rows == [f"decode/scalar/fp8/8x1@{n}" for n in (1, 2, 16, 128)]


def test_status_and_table_show_the_per_token_path(tmp_path, capsys):
    import optuna

    from codegen.tuning.buckets import Bucket

    url = f"sqlite:///{tmp_path / 'study.db'}"
    for tokens in (8192, 512):
        for path in ("per_token", "tiled"):
            bucket = Bucket("prefill", "sm90", "NVIDIA_H200", "scalar", "fp8", 16, 1, tokens, 0, path=path)
            optuna.create_study(study_name=bucket.study_name("abc", "3.6.0"), storage=url)
    assert tune.main(["status", "--storage", url]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  prefill/")]
    assert rows == [f"prefill/scalar/fp8/16x1@{n}{p}" for n in (512, 8192) for p in ("", ":per_token")]

    from codegen.configs import LaunchConfig

    doc = tuned_store.new_document("sm90", "NVIDIA H200")
    entry = dict(config=LaunchConfig(block_t=4).to_dict(), is_default=False, default_us=12.0, tuned_us=10.0,
                 trials=5, failures=1)
    sub = dict(entry, config=LaunchConfig(block_n=128).to_dict(), default_us=9.0, tuned_us=6.0)
    prov = dict(measured=True, gpu_name="NVIDIA H200", arch="sm90", triton="3.6.0", torch="x", cuda="x", hip=None,
                inputs_sha256="x", date="d", command="msa-tune")
    doc["tables"]["prefill/scalar/fp8/16x1"] = {"provenance": prov, "buckets": {
        "512": dict(entry, per_token=sub), "8192": {"per_token": sub}}}
    path = tmp_path / "sm90__NVIDIA_H200.json"
    tuned_store.write_document(path, doc)
    assert tune.main(["table", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| prefill/")]
    assert lines == ["| prefill/scalar/fp8/16x1@512 | 12.00 | 10.00 | 1.20x | 5 | 1 | block_t=4 |",
                     "| prefill/scalar/fp8/16x1@512:per_token | 9.00 | 6.00 | 1.50x | 5 | 1 | block_n=128 |",
                     "| prefill/scalar/fp8/16x1@8192:per_token | 9.00 | 6.00 | 1.50x | 5 | 1 | block_n=128 |"]


def test_writing_a_table_leaves_no_lock_file(tmp_path):
    path = tmp_path / "cfg" / "sm90__NVIDIA_H200.json"
    provenance = dict(measured=True, gpu_name="NVIDIA H200", arch="sm90", triton="3.6.0", torch="x", cuda="x",
                      hip=None, inputs_sha256="x", date="d", command="msa-tune")
    entry = dict(config={}, is_default=True, default_us=None, tuned_us=None, trials=0, failures=0)
    tuned_store.update_table(path, "sm90", "NVIDIA H200", "decode/scalar/fp8/8x1", provenance, {"1": entry})
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert tuned_store.read_document(path)["tables"]["decode/scalar/fp8/8x1"]["buckets"]["1"]["is_default"]


def test_a_static_checker_that_raises_fails_the_candidate(monkeypatch):
    from codegen.configs import LaunchConfig
    from codegen.tuning import trial
    from codegen.tuning.buckets import Bucket
    from codegen.tuning.settings import TuneSettings

    def broken(bucket, config):
        raise RuntimeError("cuobjdump not found")

    monkeypatch.setattr(trial, "static_problems", broken)
    bucket = Bucket("decode", "sm90", "NVIDIA_H200", "scalar", "fp8", 8, 1, 2, 300, head_dim=32, topk=4)
    request = dict(TuneSettings(storage="").request(bucket, LaunchConfig()), static=True, precompile=False)
    assert trial.prepare(request) == ["the static check raised RuntimeError: cuobjdump not found (fix it, or tune "
                                      "with --no-static-check)"]


def test_an_optuna_without_the_models_the_heartbeats_need_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from optuna.storages._rdb import models

    monkeypatch.delattr(models, "TrialHeartbeatModel")
    code = tune.main(_argv(tmp_path, "--trials", "4"))
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and "optuna.storages._rdb.models.TrialHeartbeatModel has no trial" in err, err
    assert not (tmp_path / "db" / "study.db").exists(), "checked before the database is touched"


def test_the_pytest_warning_filter_matches_optunas_words(tmp_path):
    """pyproject's filterwarnings silence what Optuna says about how the tuner drives it (and
    only because they match its real wording: without them, the same calls do warn)."""
    import tomllib

    import optuna

    from codegen.tuning.storage import open_storage

    filters = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]

    def warned(apply_filters: bool, name: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()  # also what codegen.tuning.study set at import
            warnings.simplefilter("always")
            if apply_filters:
                for entry in filters:
                    action, message, *category = entry.split(":")
                    assert not category, f"{entry}: a category needs its module importable in every venv"
                    warnings.filterwarnings(action, message=message)
            # What the tuner does: its storage (heartbeats, retry callback), TPE with groups, ask/tell.
            storage = open_storage(f"sqlite:///{tmp_path / name}", heartbeat_s=10)
            sampler = optuna.samplers.TPESampler(multivariate=True, group=True)
            study = optuna.create_study(storage=storage, sampler=sampler)
            study.ask()
            optuna.storages.fail_stale_trials(study)
            storage.engine.dispose()
        return [f"{w.category.__name__}: {w.message}" for w in caught]

    assert len(warned(False, "a.db")) >= 3, "these calls no longer warn: the filters may go"
    assert warned(True, "b.db") == []


def test_the_smoke_run_of_tune_sh_uses_a_fresh_folder():
    text = (REPO / "scripts" / "tune.sh").read_text()
    assert "mktemp -d" in text and "/tmp/msa-tune-smoke " not in text and "/tmp/msa-tune-smoke/" not in text


def test_the_preparer_accounts_for_its_candidates(monkeypatch):
    """The preparer's time account counts every candidate and says which phase took the time."""
    from codegen.configs import LaunchConfig
    from codegen.tuning import trial
    from codegen.tuning.buckets import Bucket
    from codegen.tuning.preparer import Preparer
    from codegen.tuning.settings import TuneSettings

    monkeypatch.setattr(trial, "static_problems", lambda bucket, config: ["too many registers"] if config.num_warps == 8 else [])
    bucket = Bucket("decode", "sm90", "NVIDIA_H200", "scalar", "fp8", 8, 1, 2, 300, head_dim=32, topk=4)
    requests = [TuneSettings(storage="").request(bucket, LaunchConfig(num_warps=w)) for w in (4, 8)]
    preparer = Preparer(1, static=True, precompile=False)
    assert preparer(requests) == [[], ["too many registers"]]
    assert preparer.candidates == 2 and set(preparer.phase_s) == {"static"}
    assert re.fullmatch(r"msa-tune: 2 candidates prepared in 1 processes: static \d+ s", preparer.account())
