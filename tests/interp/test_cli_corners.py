"""The subcommands' corners a new user still fell into (issue 38, items 6-13): every subcommand
checks its arguments, then its paths and storage, then the hardware; a bad one is one line naming
it and exit 2 before anything is touched, no GPU is exit 1; the commands that only read never
create a database; interpreter runs keep their table and studies outside the repository and
search only what runs there. Everything runs in tmp_path (the repository's folders patched to
tmp_path where a command defaults to them)."""
import os
import pathlib
import subprocess
import sys
import time

import pytest

import tune
from codegen import tuned_store
from codegen.tuning import storage as storage_module

REPO = pathlib.Path(tune.__file__).resolve().parent
SMOKE = ["--interpret", "--arch", "sm90", "--kernels", "decode", "--modes", "scalar:fp8", "--layouts", "tp8",
         "--decode-buckets", "2", "--decode-context", "300", "--head-dim", "32", "--topk", "4", "--trials", "1"]


def _cli(*args, cwd):
    return subprocess.run([sys.executable, str(REPO / "tune.py"), *args], cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=180)


def _one_line(err: str, start: str) -> None:
    assert err.startswith(start) and err.count("\n") == 1, err
    assert "Traceback" not in err


def _finished_study(db: pathlib.Path, device_name: str = "cpu-interpreter") -> str:
    """A study database holding one finished decode bucket of this checkout's kernel sources, as a
    run on `device_name` records it (what `export` rebuilds the JSON from)."""
    import optuna

    from codegen.configs import LaunchConfig
    from codegen.loader import current_inputs_sha256
    from codegen.tuning.records import RESULT
    from codegen.tuning.storage import open_storage

    url = f"sqlite:///{db}"
    store = open_storage(url)
    study = optuna.create_study(study_name="sm90:cpu_interpreter:decode/scalar/fp8/8x1@2", storage=store)
    provenance = dict(measured=True, gpu_name=device_name, arch="sm90", triton="3.9.0", torch="x", cuda=None,
                      hip=None, inputs_sha256=current_inputs_sha256("sm90", "decode", "scalar"), date="d",
                      command="msa-tune")
    entry = dict(config=LaunchConfig().to_dict(), is_default=True, default_us=1.0, tuned_us=1.0, trials=1,
                 failures=0)
    study.set_user_attr(RESULT, dict(arch="sm90", device_name=device_name, table_key="decode/scalar/fp8/8x1",
                                     tokens=2, path="tiled", entry=entry, provenance=provenance, complete=True,
                                     target=1, finished_at="2026-12-03T00:00:00"))
    store.engine.dispose()
    return url


@pytest.fixture
def repo_dirs(tmp_path, monkeypatch):
    """The repository's tuned_configs/ and tune_studies/ moved into tmp_path, so that a command that
    (wrongly) writes there leaves the real checkout alone."""
    fake = tmp_path / "repo"
    (fake / "tuned_configs").mkdir(parents=True)
    (fake / "tune_studies").mkdir()
    monkeypatch.setattr(tuned_store, "REPO_CONFIG_DIR", fake / "tuned_configs")
    monkeypatch.setattr(storage_module, "STUDY_DIR", fake / "tune_studies")
    return fake


# --- 6, 7. export: --out checked before anything is written; an interpreter table never in the repository


def test_export_to_an_impossible_out_is_one_line_and_exit_2(tmp_path):
    url = _finished_study(tmp_path / "study.db")
    proc = _cli("export", "--storage", url, "--out", "/dev/null/x", cwd=tmp_path)
    assert proc.returncode == 2, proc
    _one_line(proc.stderr, "msa-tune: --out: /dev/null is not a folder")
    assert proc.stdout == ""


def test_export_refuses_the_repository_for_interpreter_studies(tmp_path, capsys, repo_dirs):
    url = _finished_study(tmp_path / "study.db")
    assert tune.main(["export", "--storage", url]) == 2
    _one_line(capsys.readouterr().err, "msa-tune: --out: 1 finished studies ran under the Triton interpreter")
    assert list((repo_dirs / "tuned_configs").iterdir()) == [], "nothing written"
    # Outside the repository it exports, and says that it created the folder.
    assert tune.main(["export", "--storage", url, "--out", str(tmp_path / "exported")]) == 0
    out = capsys.readouterr().out
    assert f"msa-tune: created the --out folder {tmp_path / 'exported'}\n" in out
    assert (tmp_path / "exported" / "sm90__cpu_interpreter.json").exists()


# --- 8. an interpreter run keeps its studies beside --out


def test_an_interpreter_run_keeps_its_study_beside_its_out(tmp_path, capsys, repo_dirs):
    out = tmp_path / "cfg"
    assert tune.main([*SMOKE, "--out", str(out), "--list"]) == 0
    assert f"studies in sqlite:///{out / 'sm90__cpu_interpreter.db'}\n" in capsys.readouterr().out
    assert tune.main([*SMOKE, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["sm90__cpu_interpreter.db", "sm90__cpu_interpreter.json"]
    assert list((repo_dirs / "tune_studies").iterdir()) == []
    # An SQLite --storage inside the repository is refused as --out is.
    capsys.readouterr()
    inside = repo_dirs / "tune_studies" / "smoke.db"
    assert tune.main([*SMOKE, "--out", str(out), "--storage", f"sqlite:///{inside}"]) == 2
    _one_line(capsys.readouterr().err, "msa-tune: --storage: --interpret keeps its studies outside the repository")
    assert not inside.exists()


# --- 9. status and export only read: a missing SQLite file is a bad argument


@pytest.mark.parametrize("command", ["status", "export"])
@pytest.mark.parametrize("where", ["typo.db", "no-such-folder/study.db"])
def test_a_missing_study_file_is_a_bad_argument_and_never_created(tmp_path, command, where):
    path = tmp_path / where
    started = time.monotonic()
    proc = _cli(command, "--storage", f"sqlite:///{path}", cwd=tmp_path)
    assert proc.returncode == 2, proc
    _one_line(proc.stderr, f"msa-tune: --storage: no study database at {path} ")
    assert list(tmp_path.iterdir()) == [], "no database, no folder created"
    assert time.monotonic() - started < 30  # (a missing folder was retried for 5 s before)


# --- 10. values argparse accepts but the commands cannot use

ODD = [
    (["status", "--watch", "-1"], "msa-tune: --watch: expected a number > 0, got -1.0"),
    (["status", "--recent", "-5"], "msa-tune: --recent: expected a number >= 0, got -5.0"),
    (["status", "--db-retries", "-1"], "msa-tune: --db-retries: expected an integer >= 0, got -1"),
    (["--arch", "sm90", "--prefill-buckets", "1,,2", "--list"],
     "msa-tune: --prefill-buckets: expected a comma list without empty items, got '1,,2'"),
    (["--arch", "sm90", "--layouts", "tp4,", "--list"],
     "msa-tune: --layouts: expected a comma list without empty items, got 'tp4,'"),
    (["--arch", "sm90", "--write-defaults", ""],
     "msa-tune: --write-defaults: expected a GPU's name, e.g. 'AMD Instinct MI300X', got ''"),
]


@pytest.mark.parametrize("argv,line", ODD, ids=[" ".join(a) for a, _ in ODD])
def test_odd_values_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, line):
    monkeypatch.chdir(tmp_path)
    url = _finished_study(tmp_path / "study.db") if argv[0] == "status" else None
    assert tune.main([*argv, *(["--storage", url] if url else [])]) == 2
    out, err = capsys.readouterr()
    assert err == line + "\n" and out == ""


# --- 11. one order: arguments, then paths and storage, then the hardware


def test_a_bad_storage_leaves_no_out_folder_and_prints_nothing_else(tmp_path, capsys):
    out = tmp_path / "cfg"
    for storage, line in ((f"sqlite:///{tmp_path / 'a-file' / 'x.db'}",
                           f"msa-tune: --storage: {tmp_path / 'a-file'} is not a folder"),
                          ("foo://bar", "msa-tune: --storage: not a database URL SQLAlchemy understands: no dialect "
                           "'foo'")):
        (tmp_path / "a-file").write_text("")
        assert tune.main([*SMOKE, "--out", str(out), "--storage", storage]) == 2
        stdout, err = capsys.readouterr()
        _one_line(err, line)
        assert stdout == "" and not out.exists()


def test_paths_are_checked_before_the_gpu(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tune.main(["--out", "/dev/null/x"]) == 2
    _one_line(capsys.readouterr().err, "msa-tune: --out: /dev/null is not a folder")
    assert tune.main(["--out", str(tmp_path / "cfg"), "--storage", f"sqlite:///{tmp_path / 'db' / 's.db'}"]) == 1
    _one_line(capsys.readouterr().err, "msa-tune: no GPU found.")
    assert list(tmp_path.iterdir()) == [], "no GPU: nothing created"


@pytest.mark.parametrize("argv,code,line", [
    (["--layouts", "tp3"], 2, "msa-tune: --layouts: expected names from ['tp1', 'tp2', 'tp4', 'tp8']"),
    (["--modes", "scalar"], 2, "msa-tune: --modes: expected scale_mode:kv_dtype pairs"),
    (["--modes", "scalar:bf16"], 2, "msa-tune: --modes: scale mode 'scalar' needs an fp8 cache, got 'scalar:bf16'"),
    (["--query-lens", "1,,2"], 2, "msa-tune: --query-lens: expected a comma list without empty items"),
    (["--max-model-len", "0"], 2, "msa-tune: --max-model-len: expected a positive token count, got 0"),
    (["--workers", "x"], 2, "msa-tune: argument --workers: invalid int value: 'x' (see msa-tune warmup --help)"),
    ([], 1, "msa-tune: no GPU is visible (CUDA/ROCm): the warm-up compiles for one"),
])
def test_warmup_checks_its_arguments_before_the_gpu(capsys, monkeypatch, argv, code, line):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tune.main(["warmup", *argv]) == code
    out, err = capsys.readouterr()
    _one_line(err, line)
    assert out == ""


def test_table_errors_are_one_line(tmp_path, capsys):
    assert tune.main(["table", str(tmp_path / "none.json")]) == 2
    _one_line(capsys.readouterr().err, f"msa-tune: FILE: cannot read {tmp_path / 'none.json'} (")
    assert tune.main(["table", "--bogus"]) == 2
    _one_line(capsys.readouterr().err, "msa-tune: unrecognized arguments: --bogus (see msa-tune table --help)")


# --- 12. status and export say nothing about Optuna's experimental features


def test_status_and_export_print_no_optuna_warnings(tmp_path):
    url = _finished_study(tmp_path / "study.db")
    for argv in (["status", "--storage", url], ["export", "--storage", url, "--out", str(tmp_path / "cfg")]):
        proc = _cli(*argv, cwd=tmp_path)
        assert proc.returncode == 0, proc
        assert proc.stderr == "", proc.stderr


# --- 13. an interpreter run searches what runs there


def test_an_interpreter_study_never_asks_for_the_gluon_tile():
    import optuna

    from codegen.tuning.buckets import Bucket
    from codegen.tuning.space import bucket_space, bucket_ws_gqa, suggest

    cpu = Bucket("prefill", "sm90", "cpu_interpreter", "scalar", "fp8", 8, 1, 16, 0, head_dim=32, topk=4)
    gpu = Bucket("prefill", "sm90", "NVIDIA_H200", "scalar", "fp8", 8, 1, 16, 0, head_dim=32, topk=4)
    assert bucket_ws_gqa(gpu) == 8 and bucket_ws_gqa(cpu) is None
    assert not any(c.warp_specialize for c in bucket_space(cpu))
    assert any(c.warp_specialize for c in bucket_space(gpu))
    asked = dict(warp_specialize=1, convert_rows=16, block_n=64, num_warps=4, num_stages=2, block_t=2, kv_upcast=0,
                 kv_tma=1)
    config = suggest(optuna.trial.FixedTrial(asked), "sm90", "prefill", 4, "fp8", "tiled", bucket_ws_gqa(cpu))
    assert not config.warp_specialize


def test_a_prefill_only_interpreter_run_ignores_decode_settings_and_runs_clean(tmp_path, capsys):
    """The issue's run, decode's defaults left alone: accepted, and no trial fails for want of a GPU."""
    argv = ["--interpret", "--arch", "sm90", "--kernels", "prefill", "--modes", "scalar:fp8", "--layouts", "tp8",
            "--prefill-buckets", "16", "--prefill-paths", "tiled", "--head-dim", "32", "--topk", "4", "--trials", "3",
            "--out", str(tmp_path / "cfg")]
    assert tune.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "needs a GPU" not in out and "3 trials, 0 failed" in out, out
    assert tune.main([*argv[:-2], "--decode-context", "8192", "--prefill-prefix", "2000", "--out", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, "msa-tune: --interpret: this grid would run for hours under the interpreter "
                                       "(--prefill-prefix 2000 > 1024)")
