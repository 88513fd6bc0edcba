"""msa-tune: tune the MSA kernels' launch parameters on this GPU into tuned_configs/.

For every bucket (kernel x scale mode x KV dtype x head layout x token count) an Optuna study
searches the kernel's launch parameters (prefill: one study per launch path, multi-token tiles on
correlated selections and the per-token path, block_t 1, on unrelated ones); every trial runs in
an isolated worker on fresh inputs with a poisoned output, must pass the accuracy gate, and is
timed from CUDA-graph replays. A config replaces the arch default only when a confirmation run
shows it faster by --margin. Results go to tuned_configs/<arch>__<DEVICE>.json (atomic, merged per
table), which the runtime loads.

  msa-tune                                   # the default grid on the current GPU
  msa-tune --list                            # what would be tuned and which file is written
  msa-tune --kernels decode --modes scalar:fp8 --layouts tp4 --decode-buckets 1,64
  msa-tune --storage postgresql+psycopg://user@host/db   # studies shared by workers on many GPUs/hosts
  msa-tune status --storage URL              # per bucket: trials done/running/failed, best, workers alive
  msa-tune export --storage URL              # rebuild tuned_configs/*.json from the finished studies
  msa-tune table [FILE]                      # a tuned-config file as a markdown table
  msa-tune warmup --layouts tp4              # compile what the table can pick, before the first request

Any number of workers may run the same command against one --storage (one process per GPU, on one
host or many): each bucket's study is worked by whoever is free, no config is measured twice, and
the worker that finishes a bucket's confirmation writes it to the JSON (docs/multi-gpu-tuning.md).
Every subcommand checks its arguments, then its paths and storage, then the hardware. Exit codes:
0 done, 2 bad arguments (one line naming the argument, before anything is touched; an --out or
SQLite --storage path that cannot be written included, and for status and export an SQLite file
that does not exist), 3 the study database cannot be reached or was lost, 1 anything else (e.g. no
GPU to tune on); 141 when the reader of the output closed the pipe (`msa-tune --list | head -1`),
quietly. Without a GPU, --interpret runs a smoke run (codegen/tuning/smoke.py) into an --out folder
outside the repository, its studies beside it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time


def _parser():
    from codegen.tuning.argparsing import tune_parser

    return tune_parser(__doc__)


def _check(args) -> None:
    """Every check that needs neither a GPU nor a database; raises ValueError naming the argument."""
    from codegen.configs import LaunchConfig
    from codegen.tuning import argparsing as A
    from codegen.tuning.seeding import seed_configs_from
    from codegen.validate import HEAD_DIM_RULE, head_dim_ok
    from codegen.variants import ARCHS

    archs = sorted(ARCHS)
    if args.arch != "auto" and args.arch not in ARCHS:
        raise ValueError(f"--arch: expected auto or one of {archs}, got {args.arch!r}")
    if args.arch == "auto" and args.interpret:
        raise ValueError(f"--arch: --interpret runs no GPU to detect the arch from: give one of {archs}")
    if args.write_defaults is not None and not args.write_defaults.strip():  # "" is a mistake, not "off"
        raise ValueError("--write-defaults: expected a GPU's name, e.g. 'AMD Instinct MI300X', got "
                         f"{args.write_defaults!r}")
    if args.arch == "auto" and args.write_defaults is not None:
        raise ValueError(f"--arch: --write-defaults needs one of {archs}")
    if args.trials is not None:
        A.at_least("--trials", args.trials, 1, what="an integer")
    if args.patience is not None:
        A.at_least("--patience", args.patience, 1, what="an integer")
    args.full_search = A.count_or_all("--full-search", args.full_search)
    A.at_least("--leaders", args.leaders, 1, what="an integer")
    if not head_dim_ok(args.head_dim):
        raise ValueError(f"--head-dim: expected {HEAD_DIM_RULE}, got {args.head_dim}")
    A.at_least("--topk", args.topk, 1, what="an integer")
    A.at_least("--decode-context", args.decode_context, 1, what="an integer")
    A.at_least("--prefill-prefix", args.prefill_prefix, 0, what="an integer")
    A.above("--bucket-time", args.bucket_time, 0)
    A.above("--time-budget", args.time_budget, 0)
    A.at_least("--margin", args.margin, 0)
    A.above("--trial-timeout", args.trial_timeout, 0)
    A.at_least("--precompile-workers", args.precompile_workers, 0, what="an integer")
    A.at_least("--heartbeat", args.heartbeat, 1, what="an integer")
    A.at_least("--db-retries", args.db_retries, 0, what="an integer")
    A.at_least("--db-retry-seconds", args.db_retry_seconds, 0)
    A.database_url("--storage", args.storage)
    if args.runner is not None and not all(args.runner.partition(":")[::2]):
        raise ValueError(f"--runner: expected module:function, got {args.runner!r}")
    if not args.candidates:
        args.candidates = None  # not given: the whole space
    else:
        text = args.candidates
        if text.startswith("@"):  # a file: the provenance then records its path, not its contents
            try:
                text = pathlib.Path(text[1:]).read_text()
            except OSError as exc:
                raise ValueError(f"--candidates: cannot read {text[1:]!r} ({exc.strerror})") from None
        try:
            configs = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--candidates: not JSON ({exc})") from None
        if isinstance(configs, list):
            args.candidates = [LaunchConfig.from_dict(c, what="--candidates[]") for c in configs]
        elif isinstance(configs, dict):
            args.candidates = {}
            for table, table_configs in configs.items():
                if not isinstance(table_configs, list):
                    raise ValueError(f"--candidates[{table!r}]: expected a JSON list of configs")
                args.candidates[table] = [LaunchConfig.from_dict(c, what=f"--candidates[{table!r}][]")
                                          for c in table_configs]
        else:
            raise ValueError("--candidates: expected a JSON list of configs, or an object of such lists by table")
    args.seed_configs = (None if args.seed_from in ("auto", "none")  # auto: once the file is known (_tune)
                         else seed_configs_from(pathlib.Path(args.seed_from), "--seed-from"))
    grid = _grid(args, args.arch, "check")  # --kernels, --modes, --layouts, --*-buckets
    if isinstance(args.candidates, dict):
        args.candidates = A.candidates_for_grid(args.candidates, {b.table_key for b in grid})
    if args.candidates is not None and args.arch != "auto":  # with auto: once the GPU names the arch (main)
        _check_candidates(args.candidates, grid)
    args.trials = A.trials_for(args.trials, args.candidates)
    if args.interpret_any_size and not args.interpret:
        raise ValueError("--interpret-any-size: only means something with --interpret")
    if args.interpret and args.write_defaults is None:
        from codegen import tuned_store
        from codegen.tuning import smoke

        smoke.check_out(args.out, tuned_store.REPO_CONFIG_DIR.parent)
        smoke.check_storage(args.storage, tuned_store.REPO_CONFIG_DIR.parent)
        smoke.check_candidates(args.candidates)
        if not args.list:  # listing a large grid is how to see it
            smoke.check_size(args, grid)


def _check_candidates(candidates, grid) -> None:
    """Every candidate must be one its tables' studies can run as given (before anything is touched)."""
    from codegen.tuning.space import check_candidate

    for bucket in {b.table_key: b for b in grid}.values():
        listed = candidates.get(bucket.table_key, []) if isinstance(candidates, dict) else candidates
        where = f"--candidates[{bucket.table_key!r}]" if isinstance(candidates, dict) else "--candidates"
        for i, config in enumerate(listed):
            check_candidate(config, arch=bucket.arch, kernel=bucket.kernel, num_q_heads=bucket.num_q_heads,
                            num_kv_heads=bucket.num_kv_heads, topk=bucket.topk, kv_dtype=bucket.kv_dtype,
                            scale_mode=bucket.scale_mode, what=f"{where}[{i}] for {bucket.table_key}")


def _grid(args, arch: str, device: str) -> list:
    from codegen.tuning import argparsing as A
    from codegen.tuning import buckets as B

    kernels = A.items("--kernels", args.kernels)
    if any(k not in ("prefill", "decode") for k in kernels):
        raise ValueError(f"--kernels: expected a comma list of prefill, decode; got {args.kernels!r}")
    grid = B.grid(arch=arch, device=device, kernels=kernels, modes=B.parse_modes(args.modes),
                  layouts=A.items("--layouts", args.layouts),
                  decode_buckets=B.parse_ints(args.decode_buckets, "--decode-buckets"),
                  prefill_buckets=B.parse_ints(args.prefill_buckets, "--prefill-buckets"),
                  decode_context=args.decode_context, prefill_prefix=args.prefill_prefix, pattern=args.pattern,
                  prefill_paths=B.parse_paths(args.prefill_paths), topk=args.topk)
    return [dataclasses.replace(b, head_dim=args.head_dim) for b in grid]


def _versions() -> dict:
    import torch
    import triton

    return dict(triton=triton.__version__, torch=torch.__version__, cuda=torch.version.cuda,
                hip=getattr(torch.version, "hip", None))


class NoDevice(RuntimeError):
    """No GPU to tune on, or not the one --arch names (exit code 1)."""


def _device(args) -> tuple[str, str | None]:
    """(arch, device name) of where trials run; (arch or "auto", None) for --list without a GPU."""
    import torch

    if args.interpret:
        from codegen.tuning.smoke import DEVICE

        return args.arch, DEVICE
    if not torch.cuda.is_available():
        if args.list:
            return args.arch, None
        from codegen.tuning.smoke import SMOKE_COMMAND

        raise NoDevice(f"no GPU found. Tune on the GPU you serve on, or test the pipeline on this CPU (timings "
                       f"then mean nothing): bash scripts/tune.sh, which runs {SMOKE_COMMAND}")
    from codegen.validate import detect_device_arch

    arch = detect_device_arch(torch.device("cuda"))
    if args.arch not in ("auto", arch):
        raise NoDevice(f"--arch {args.arch} does not match this GPU ({arch})")
    return arch, torch.cuda.get_device_name()


def _list(args, arch: str, device_name: str | None, grid: list) -> int:
    """--list: what would be tuned and where it would go; touches nothing."""
    from codegen import tuned_store
    from codegen.tuning.outputs import run_paths
    from codegen.tuning.storage import display_url

    out_path, storage = run_paths(args, arch, device_name)
    if device_name is None:
        print(f"msa-tune: no GPU here; on a GPU this writes {out_path} (DEVICE: the GPU's normalized name)")
    else:
        print(f"msa-tune: will write {out_path}")
        if (lent := tuned_store.lender(arch, device_name)) is not None:
            print(f"msa-tune: until then this GPU runs {lent}'s tables (tuned_store.BORROWED_TABLES), table by table")
    print(f"msa-tune: studies in {display_url(storage) if args.storage else storage}")  # <DEVICE> unescaped
    print(f"msa-tune: {len(grid)} buckets, up to {args.trials} trials each")
    for b in grid:
        print(f"  {b.label}")
    return 0


def main(argv=None) -> int:
    """The msa-tune command (exit codes: the module docstring). A reader that closes the pipe
    early (`msa-tune --list | head -1`) ends it quietly, as the shell does a process killed by
    SIGPIPE (exit 141), after the run's own clean-up."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Whatever is still buffered for the closed pipe would raise again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _bad(exc: Exception) -> int:
    """A bad argument: one line naming it (the message does), exit code 2."""
    print(f"msa-tune: {exc}", file=sys.stderr)
    return 2


def _main(argv=None) -> int:
    """Every subcommand checks in one order: its arguments, then its paths and storage, then the
    hardware; a bad argument or path is exit 2 before anything is touched (the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["status"], ["export"]):
        from codegen.tuning import status

        return status.main(argv)
    if argv[:1] == ["warmup"]:
        from codegen.tuning import warmup_cli

        return warmup_cli.main(argv[1:])
    if argv[:1] == ["table"]:
        from codegen.tuning import table

        return table.main(argv[1:])
    args, code = _parser().parse_or_exit_code(argv)
    if args is None:
        return code
    try:
        _check(args)
        if not args.list and args.write_defaults is None:  # --list touches nothing, so checks no path
            from codegen.tuning import outputs
            from codegen.tuning.smoke import DEVICE

            # Before the GPU is asked only the folders are known: the file names hold its name.
            outputs.check_run_paths(args, args.arch, DEVICE if args.interpret else None)
    except (ValueError, TypeError) as exc:
        return _bad(exc)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    if args.write_defaults is not None:
        return _write_defaults(args, argv)
    try:
        arch, device_name = _device(args)
    except NoDevice as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 1
    if args.candidates is not None and args.arch == "auto" and arch != "auto":
        try:  # still before anything is touched
            _check_candidates(args.candidates, _grid(args, arch, "check"))
        except (ValueError, TypeError) as exc:
            return _bad(exc)
    if args.list:
        from codegen import tuned_store

        return _list(args, arch, device_name, _grid(args, arch, tuned_store.normalize_device_name(device_name or "-")))
    return _tune(args, argv, arch, device_name)


def _write_defaults(args, argv) -> int:
    """--write-defaults: the arch defaults as an unmeasured file; no GPU, no database."""
    from codegen import tuned_store
    from codegen.tuning import outputs, publish

    out_path = (args.out or tuned_store.REPO_CONFIG_DIR) / tuned_store.file_name(args.arch, args.write_defaults)
    try:
        outputs.check_out(out_path)
        outputs.create_folder("--out", out_path.parent)
    except ValueError as exc:
        return _bad(exc)
    grid = _grid(args, args.arch, tuned_store.normalize_device_name(args.write_defaults))
    versions = dict(_versions(), cuda=None, hip=None)
    publish.write_defaults(out_path, args.arch, args.write_defaults, grid, versions, argv)
    print(f"msa-tune: wrote unmeasured defaults to {out_path}")
    return 0


def _tune(args, argv, arch: str, device_name: str) -> int:
    from codegen import loader, tuned_store
    from codegen.tuning import outputs
    from codegen.tuning.gpu_lock import new_lock_path, remove_lock
    from codegen.tuning.heartbeats import OptunaIncompatible
    from codegen.tuning.preparer import Preparer
    from codegen.tuning.publish import Publisher
    from codegen.tuning.schedule import results_table, tune_grid
    from codegen.tuning.seeding import seed_configs_from
    from codegen.tuning.settings import TUNER_ID, TuneSettings
    from codegen.tuning.state import TunerState
    from codegen.tuning.storage import StorageUnavailable, display_url, startup_failure
    from codegen.tuning.worker import DEFAULT_RUNNER, TrialWorker

    versions = _versions()
    device = tuned_store.normalize_device_name(device_name)
    grid = _grid(args, arch, device)
    try:  # every path this run writes, now with the GPU's name, before the first trial
        out_path, storage = outputs.check_run_paths(args, arch, device_name)
        # A re-tune starts from the tables it replaces: those of the file it writes, and for a GPU that
        # borrows (tuned_store.BORROWED_TABLES: an H100 the H200's) its lender's, which served it until now.
        seed_paths = [] if args.seed_from != "auto" else [
            path for path in (loader.lender_file(arch, device_name), out_path) if path is not None and path.exists()]
        if seed_paths:
            args.seed_configs = {}
            for seed_path in seed_paths:  # the file it writes last: its tables' configs win
                if seed_path != out_path:
                    print(f"msa-tune: seeds from {seed_path}, the table this GPU borrows")
                try:
                    args.seed_configs.update(seed_configs_from(seed_path, "--seed-from auto"))
                except ValueError as exc:
                    raise ValueError(f"{exc} (--seed-from none: tune without it)") from None
        workload = dict(decode_context=args.decode_context, prefill_prefix=args.prefill_prefix, pattern=args.pattern,
                        head_dim=args.head_dim, topk=args.topk)
        if args.skip_published:  # a broken file is a bad argument here, as for --seed-from
            from codegen.tuning.publish import unpublished

            grid = unpublished(grid, out_path, device_name, versions["triton"], workload)
        outputs.create_folders(out_path, storage)  # every check passed: the first thing touched
    except ValueError as exc:
        return _bad(exc)
    print(f"msa-tune: {device_name} ({arch}, normalized {device}), triton {versions['triton']}, torch {versions['torch']}")
    print(f"msa-tune: will write {out_path}")
    print(f"msa-tune: studies in {display_url(storage)}")
    print(f"msa-tune: {len(grid)} buckets, up to {args.trials} trials each")
    workers = args.precompile_workers
    if workers is None:
        workers = 0 if args.interpret else max(1, min(12, (os.cpu_count() or 2) - 2))
    settings = TuneSettings(storage=storage, trials=args.trials, patience=args.patience, bucket_time_s=args.bucket_time,
                            full_search=args.full_search, leaders=args.leaders,
                            margin=args.margin,
                            trial_timeout_s=args.trial_timeout, interpret=args.interpret,
                            precompile_workers=workers, runner=args.runner or DEFAULT_RUNNER,
                            static_check=not args.no_static_check and not args.interpret, seed=args.seed,
                            heartbeat_s=args.heartbeat,
                            deadline=(time.monotonic() + args.time_budget) if args.time_budget else None,
                            candidates=args.candidates, seed_configs=args.seed_configs, db_retries=args.db_retries,
                            db_retry_s=args.db_retry_seconds, gpu_lock=None if args.interpret else new_lock_path())
    log = lambda line: print(line, flush=True)  # noqa: E731
    try:
        state = TunerState(settings, log=log)  # connects now: an unreachable database stops us here
    except (StorageUnavailable, OptunaIncompatible, ValueError) as exc:
        return startup_failure(exc)
    print(f"msa-tune: worker {TUNER_ID}", flush=True)
    worker = TrialWorker(settings.runner, {"TRITON_INTERPRET": "1"} if args.interpret else {})
    preparer = Preparer(workers, static=settings.static_check, precompile=not args.interpret)
    publisher = Publisher(out_path, arch, device_name, versions, argv, args.interpret, workload=workload)
    started = time.monotonic()
    results: list = []
    try:
        tune_grid(grid, settings, state, worker, preparer, publisher, log=log, results=results)
    except StorageUnavailable as exc:
        print(results_table(results, time.monotonic() - started))
        print(state.report(), flush=True)
        print(f"msa-tune: {exc}", file=sys.stderr, flush=True)
        return 3
    except OSError as exc:  # e.g. --out filled up or became read-only mid-run; its claim is released
        if isinstance(exc, BrokenPipeError):
            raise  # the reader left: main() ends quietly
        print(results_table(results, time.monotonic() - started))
        print(f"msa-tune: {exc}; every trial recorded so far is kept, re-run the same command to resume",
              file=sys.stderr, flush=True)
        return 1
    finally:
        worker.close()
        preparer.close()
        state.close()
        remove_lock(settings.gpu_lock)
    print(results_table(results, time.monotonic() - started))
    print(state.report(), flush=True)
    if preparer.candidates:  # nothing to say under the interpreter (no static checks, no compiles ahead)
        print(preparer.account(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
