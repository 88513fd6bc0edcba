"""A new user's first hour (issue 26): msa-tune fails fast on paths it cannot write and leaves no
claim behind, keeps the interpreter to a smoke run outside the repository, ends quietly on a closed
pipe and documents every option; the two scripts say what they skip and leave no folder behind.
Everything runs in tmp_path or a scratch copy of a script, never in the repository."""
import errno
import json
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile

import pytest

import tune
from codegen import tuned_store
from codegen.tuning import smoke

REPO = pathlib.Path(tune.__file__).resolve().parent
ISSUE_COMMAND = ["--interpret", "--arch", "sm90", "--kernels", "decode", "--modes", "scalar:fp8", "--layouts", "tp8",
                 "--decode-buckets", "2", "--decode-context", "300", "--head-dim", "32", "--topk", "4"]


def _cli(*args, cwd, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, str(REPO / "tune.py"), *args], cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=180)


def _unwritable_folder(tmp_path) -> pathlib.Path:
    """A folder this process cannot create files in: chmod 555 for a normal user; as root (which
    ignores permission bits) sysfs' top folder, if it refuses here too."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:
        os.close(tempfile.mkstemp(dir="/sys")[0])
    except OSError:
        return pathlib.Path("/sys")
    pytest.skip("no folder refuses a new file to root here")


# --- 1. paths checked before the first trial; a failing worker releases its claim


def test_an_unwritable_out_is_one_line_and_exit_2_before_any_trial(tmp_path):
    """The issue's command, run as a user runs it: refused in seconds, before the study exists."""
    work = tmp_path / "work"
    work.mkdir()
    locked = _unwritable_folder(tmp_path)
    proc = _cli(*ISSUE_COMMAND, "--trials", "4", "--out", str(locked / "cfg"),
                "--storage", f"sqlite:///{work / 'scratch.db'}", cwd=work)
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith(f"msa-tune: --out: cannot create the folder {locked / 'cfg'} (") and \
        proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert list(work.iterdir()) == [], "nothing may be touched: not even the study database"


@pytest.mark.parametrize("where", ["out", "out-parent-is-a-file", "storage"])
def test_every_output_path_is_checked_and_named(tmp_path, capsys, where):
    locked = _unwritable_folder(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    out, storage = tmp_path / "cfg", tmp_path / "db" / "study.db"
    if where == "out":
        out, line = locked, f"msa-tune: --out: cannot write into {locked} ("
    elif where == "out-parent-is-a-file":
        out, line = tmp_path / "a-file", f"msa-tune: --out: {tmp_path / 'a-file'} is not a folder"
    else:
        storage, line = locked / "study.db", f"msa-tune: --storage: cannot write into {locked} ("
    assert tune.main([*ISSUE_COMMAND, "--trials", "1", "--out", str(out), "--storage", f"sqlite:///{storage}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(line) and captured.err.count("\n") == 1, captured.err
    assert not storage.exists(), "a refused run creates no study"


def _claims(db: pathlib.Path) -> list:
    con = sqlite3.connect(db)
    try:
        return con.execute("select value_json from study_user_attributes where key = 'finishing'").fetchall()
    finally:
        con.close()


def test_a_worker_that_cannot_write_its_table_releases_its_claim(tmp_path, capsys, monkeypatch):
    """The table's folder turns read-only after the start check: one line, exit 1, the finish claim
    deleted; the next run to a writable --out finishes the bucket at once (no wait on a dead claim),
    and says that it created its --out folder."""
    db = tmp_path / "study.db"
    argv = [*ISSUE_COMMAND, "--trials", "1", "--storage", f"sqlite:///{db}"]
    real_write = tuned_store.write_document

    def read_only(path, doc):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(tuned_store, "write_document", read_only)
    assert tune.main([*argv, "--out", str(tmp_path / "ro")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("msa-tune: [Errno 30] Read-only file system") and err.count("\n") == 1, err
    assert _claims(db) == [], "the claim of a worker that failed must not outlive it"
    monkeypatch.setattr(tuned_store, "write_document", real_write)
    assert tune.main([*argv, "--out", str(tmp_path / "cfg")]) == 0
    out = capsys.readouterr().out
    assert f"msa-tune: created the --out folder {tmp_path / 'cfg'}\n" in out
    assert "another worker is confirming it" not in out
    assert (tmp_path / "cfg" / "sm90__cpu_interpreter.json").exists()
    assert [json.loads(v)["done"] for v, in _claims(db)] == [True]


# --- 2. the interpreter runs a smoke run, outside the repository


def test_the_no_gpu_hint_and_the_interpreter_default_grid(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert tune.main([]) == 1
    assert capsys.readouterr().err == ("msa-tune: no GPU found. Tune on the GPU you serve on, or test the pipeline on "
                                       "this CPU (timings then mean nothing): bash scripts/tune.sh, which runs "
                                       f"{smoke.SMOKE_COMMAND}\n")
    # What the hint used to say: refused at once, naming --out, then (with one) the grid's size.
    assert tune.main(["--interpret", "--arch", "sm90"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msa-tune: --out: --interpret needs a folder outside the repository") and err.count("\n") == 1
    assert err.endswith(f"the smoke run of bash scripts/tune.sh is: {smoke.SMOKE_COMMAND}\n")
    assert tune.main(["--interpret", "--arch", "sm90", "--out", str(tmp_path / "cfg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msa-tune: --interpret: this grid would run for hours under the interpreter (216 buckets "
                          "> 4, --trials 40 > 20, a bucket of 32768 tokens > 64, --head-dim 128 > 64, --topk 16 > 8, "
                          "--decode-context 8192 > 1024); the smoke run of bash scripts/tune.sh is: "), err
    assert err.endswith("(--interpret-any-size runs it anyway)\n") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["tuned_configs", ".", "results/cpu"])
def test_an_interpreter_run_never_writes_into_the_repository(tmp_path, capsys, out):
    assert tune.main([*ISSUE_COMMAND, "--trials", "1", "--out", str(REPO / out), "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"msa-tune: --out: --interpret needs a folder outside the repository {REPO}, got ")


def test_interpret_any_size_is_the_explicit_way_past_the_limit(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(tune, "_tune", lambda args, argv, arch, device_name: ran.append(device_name) or 0)
    big = [*ISSUE_COMMAND, "--trials", "21", "--out", str(tmp_path / "cfg")]
    assert tune.main(big) == 2 and ran == []
    assert "(--trials 21 > 20)" in capsys.readouterr().err
    assert tune.main([*big, "--interpret-any-size"]) == 0 and ran == ["cpu-interpreter"]
    assert tune.main([*ISSUE_COMMAND, "--trials", "20", "--out", str(tmp_path / "cfg")]) == 0  # smoke-sized
    assert tune.main(["--interpret-any-size", "--list"]) == 2
    assert capsys.readouterr().err == "msa-tune: --interpret-any-size: only means something with --interpret\n"
    assert list(tmp_path.iterdir()) == []


# --- 4. a closed pipe; 5. --help


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`msa-tune --list | true`: the reader is gone before the first line; no traceback, exit 141
    (what the shell reports for a process SIGPIPE ended)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _cli("--list", cwd=tmp_path, stdout=write)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc
    assert proc.stderr == "", proc.stderr


def test_help_shows_the_subcommands_and_every_options_help_and_default():
    import argparse

    parser = tune._parser()
    usage = parser.format_usage()
    for sub in ("status", "export", "table", "warmup"):
        assert f"msa-tune {sub}" in usage, usage
    missing_help, missing_default = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        name = action.option_strings[-1]
        if not action.help:
            missing_help.append(name)
        elif action.nargs != 0 and "default" not in action.help:  # flags (store_true) are off by default
            missing_default.append(name)
    assert missing_help == [] and missing_default == [], (missing_help, missing_default)
    text = " ".join(parser.format_help().split())  # unwrapped
    assert "before it stops searching (default 300)" in text and "counts as hung (default 180)" in text


# --- 8, 9. the two scripts, run in a scratch copy with stand-ins for the venv


def _scratch(tmp_path, script: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A copy of scripts/<script> in a fake checkout whose setup.sh does nothing and whose .venv
    holds stand-ins: python fails (no GPU, and records its arguments), msa-tune records its arguments
    and whether its --out folder exists."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / script, root / "scripts" / script)
    (root / "scripts" / "setup.sh").write_text("exit 0\n")
    log = tmp_path / "calls.log"
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\nexit 1\n')
    (bin_dir / "msa-tune").write_text(
        f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done > {log}\n'
        'while [ $# -gt 0 ]; do [ "$1" = --out ] && [ -d "$2" ] && echo "out exists"; shift; done\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    return root, log


def test_tune_sh_runs_the_smoke_run_and_leaves_no_folder(tmp_path):
    root, log = _scratch(tmp_path, "tune.sh")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(["bash", "scripts/tune.sh", "--trials", "2"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=str(tmp)), timeout=60)
    assert proc.returncode == 0, proc
    args = log.read_text().splitlines()
    folder = args[args.index("--out") + 1]
    assert args == [*smoke.SMOKE_ARGS, "--out", folder, "--storage", f"sqlite:///{folder}/study.db", "--trials", "2"]
    assert "out exists" in proc.stdout, "the folder must exist while msa-tune runs"
    assert folder.startswith(str(tmp)) and list(tmp.iterdir()) == [], "tune.sh must remove its folder"


def test_test_sh_says_what_it_skips_and_how_to_run_it(tmp_path):
    root, log = _scratch(tmp_path, "test.sh")
    (root / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    env = {k: v for k, v in os.environ.items() if k != "MSA_TUNE_TEST_PG_URL"}
    proc = subprocess.run(["bash", "scripts/test.sh"], cwd=root, capture_output=True, text=True, timeout=60,
                          env=dict(env, MSA_TUNE_VLLM_VENV="0"))
    assert proc.returncode == 0, proc
    assert "== SKIPPED tests/postgres" in proc.stdout and ".ci/run" in proc.stdout, proc.stdout
    assert "MSA_TUNE_TEST_PG_URL=postgresql+psycopg://" in proc.stdout
    assert "== SKIPPED tests/vllm: MSA_TUNE_VLLM_VENV=0" in proc.stdout
    assert "tests/postgres" not in log.read_text(), "skipped means not run"


# --- 3, 6, 10. the README


def test_the_readme_is_short_says_where_commands_live_and_what_is_checked():
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 14_000, f"README.md is {len(text.encode())} bytes; keep it <= 14 KB"
    assert text.count("source .venv/bin/activate") == 1 and text.count(".venv/bin/msa-tune") == 1
    results = text.split("## Results\n", 1)[1].split("\n## ", 1)[0]
    assert results.strip() == "Measured runs, one line each: [results/README.md](results/README.md).", results
    bad_input = text.split("- **Bad input**", 1)[1].split("\n- ", 1)[0]
    for said in ("shapes", "dtypes", "devices", "device sync", "MSA_TUNE_CHECK_VALUES=1", "first offending index",
                 "outside"):
        assert said in bad_input, said


def test_status_and_export_options_say_their_defaults():
    import argparse

    from codegen.tuning import status

    subparsers = next(a for a in status._parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.option_strings)
            assert action.nargs == 0 or "default" in action.help, (name, action.option_strings)
