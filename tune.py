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
Exit codes: 0 done, 2 bad arguments (one line naming the argument, before anything is touched),
3 the study database cannot be reached or was lost, 1 anything else (e.g. no GPU to tune on).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time


def _parser() -> argparse.ArgumentParser:
    from codegen import shapes as S
    from codegen.tuning.argparsing import Parser

    p = Parser(prog="msa-tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="auto", help="sm90 | gfx942 | auto (from the GPU; required with --interpret)")
    p.add_argument("--interpret", action="store_true",
                   help="run on the CPU under the Triton interpreter (pipeline test; timings are meaningless)")
    p.add_argument("--kernels", default="prefill,decode", help="comma list of prefill, decode")
    p.add_argument("--modes", default=",".join(f"{m}:{k}" for m, k in S.DEFAULT_MODES),
                   help="comma list of SCALE_MODE:KV_DTYPE (default %(default)s)")
    p.add_argument("--layouts", default=",".join(S.DEFAULT_LAYOUTS), help=f"head layouts from {sorted(S.HEAD_LAYOUTS)}")
    p.add_argument("--decode-buckets", default=",".join(map(str, S.DECODE_BUCKETS)), help="decode requests per bucket")
    p.add_argument("--prefill-buckets", default=",".join(map(str, S.PREFILL_BUCKETS)), help="prefill chunk tokens")
    p.add_argument("--decode-context", type=int, default=8192, help="tokens cached per decode request")
    p.add_argument("--prefill-prefix", type=int, default=0, help="cached prefix before the prefill chunk")
    p.add_argument("--pattern", default="correlated", choices=("correlated", "random"),
                   help="tiled prefill selections: neighbours share blocks (correlated) or not (random)")
    p.add_argument("--prefill-paths", default="tiled,per_token",
                   help="comma list of prefill launch paths to tune: tiled (block_t searched, --pattern "
                        "selections) and per_token (block_t 1, unrelated selections after a prefix of at least "
                        "4 x topk pages; its own sub-entry per bucket) (default %(default)s)")
    p.add_argument("--head-dim", type=int, default=128, help="a power of two >= 16 (default %(default)s)")
    p.add_argument("--topk", type=int, default=16, help="blocks selected per query row (default %(default)s)")
    p.add_argument("--trials", type=int, default=40, help="configs evaluated per bucket (default %(default)s)")
    p.add_argument("--bucket-time", type=float, default=300, help="seconds per bucket before it stops searching")
    p.add_argument("--patience", type=int, default=None,
                   help="stop a bucket's search after this many evaluated trials in a row that did not beat its "
                        "best by more than 1%% (default: off, every bucket runs --trials)")
    p.add_argument("--full-search", default="2",
                   help="per table and launch path, the first N buckets of the grid's order (the ends of the token "
                        "range) search the whole space; each later bucket measures only the default and the "
                        "--leaders fastest configs of each of those studies (plus its --seed-from config). 'all': "
                        "every bucket searches the whole space (default %(default)s)")
    p.add_argument("--leaders", type=int, default=4,
                   help="configs a bucket takes from each full search of its table (default %(default)s)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run; the rest resumes later")
    p.add_argument("--margin", type=float, default=0.03, help="min confirmed gain over the default (default 3%%)")
    p.add_argument("--trial-timeout", type=float, default=180, help="seconds before a trial counts as hung")
    p.add_argument("--storage", default=None,
                   help="Optuna RDB URL (default: sqlite file tune_studies/<arch>__<DEVICE>.db in the repo, resumable)")
    p.add_argument("--out", type=pathlib.Path, default=None, help="config folder (default: the repo's tuned_configs/)")
    p.add_argument("--precompile-workers", type=int, default=None, help="parallel compile processes (default: cores-2, max 12)")
    p.add_argument("--no-static-check", action="store_true", help="skip the ahead-of-time resource check")
    p.add_argument("--candidates", default=None,
                   help="JSON list of configs to search instead of the whole space (the default is always added), "
                        'or an object of such lists by table ({"decode/scalar/fp8/16x1": [...], ...}: a table '
                        "left out searches the default alone); @FILE reads the JSON from FILE")
    p.add_argument("--seed-from", default="auto",
                   help="a tuned-config JSON (e.g. the file before a kernel change): each study tries that "
                        "file's configs for its table first, after the default (they count as trials); 'auto' "
                        "(default): the file this run writes, when it exists; 'none': no seeds")
    p.add_argument("--runner", default=None, help=argparse.SUPPRESS)  # module:function, for tests
    p.add_argument("--heartbeat", type=int, default=10,
                   help="seconds between trial heartbeats; a trial silent for 3 beats is failed and retried")
    p.add_argument("--db-retries", type=int, default=5,
                   help="retries of a database call that lost its connection, with backoff 1, 2, 4, ... s "
                        "(default %(default)s); then the worker stops with exit code 3")
    p.add_argument("--db-retry-seconds", type=float, default=30.0,
                   help="at most this long waiting for the database per call (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true",
                   help="print the buckets and the output file, then exit (no GPU needed)")
    p.add_argument("--write-defaults", metavar="DEVICE_NAME", default=None,
                   help="no GPU needed: write the arch defaults for DEVICE_NAME (with --arch) as an unmeasured "
                        "file, e.g. for a GPU nobody could tune on yet")
    return p


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
    if args.arch == "auto" and args.write_defaults:
        raise ValueError(f"--arch: --write-defaults needs one of {archs}")
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
        tables = {b.table_key for b in grid}
        unknown = sorted(set(args.candidates) - tables)
        if unknown:
            raise ValueError(f"--candidates: table(s) {unknown} are not in this run's grid; expected some of {sorted(tables)}")
    if args.candidates is not None and args.arch != "auto":  # with auto: once the GPU names the arch (main)
        _check_candidates(args.candidates, grid)


def _check_candidates(candidates, grid) -> None:
    """Every candidate must be one its tables' studies can run as given (before anything is touched)."""
    from codegen.tuning.space import check_candidate

    for bucket in {b.table_key: b for b in grid}.values():
        listed = candidates.get(bucket.table_key, []) if isinstance(candidates, dict) else candidates
        where = f"--candidates[{bucket.table_key!r}]" if isinstance(candidates, dict) else "--candidates"
        for i, config in enumerate(listed):
            check_candidate(config, arch=bucket.arch, kernel=bucket.kernel, num_q_heads=bucket.num_q_heads,
                            num_kv_heads=bucket.num_kv_heads, topk=bucket.topk, kv_dtype=bucket.kv_dtype,
                            what=f"{where}[{i}] for {bucket.table_key}")


def _grid(args, arch: str, device: str) -> list:
    from codegen.tuning import buckets as B

    kernels = [k for k in args.kernels.split(",") if k]
    if not kernels or any(k not in ("prefill", "decode") for k in kernels):
        raise ValueError(f"--kernels: expected a comma list of prefill, decode; got {args.kernels!r}")
    grid = B.grid(arch=arch, device=device, kernels=kernels, modes=B.parse_modes(args.modes),
                  layouts=[x for x in args.layouts.split(",") if x],
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
        return args.arch, "cpu-interpreter"
    if not torch.cuda.is_available():
        if args.list:
            return args.arch, None
        raise NoDevice("no GPU found. Tune on the GPU you serve on, or run a pipeline test with "
                       "--interpret --arch sm90 (timings then mean nothing).")
    from codegen.validate import detect_device_arch

    arch = detect_device_arch(torch.device("cuda"))
    if args.arch not in ("auto", arch):
        raise NoDevice(f"--arch {args.arch} does not match this GPU ({arch})")
    return arch, torch.cuda.get_device_name()


def _list(args, arch: str, device_name: str | None, grid: list) -> int:
    """--list: what would be tuned and where it would go; touches nothing."""
    from codegen import tuned_store
    from codegen.tuning.storage import STUDY_DIR, display_url

    out_dir = args.out or tuned_store.REPO_CONFIG_DIR
    if device_name is None:  # no GPU: the grid is the same on every GPU, the file name is not
        stem = f"{arch if arch != 'auto' else '<arch>'}__<DEVICE>"
        print(f"msa-tune: no GPU here; on a GPU this writes {out_dir / (stem + '.json')} "
              f"(DEVICE: the GPU's normalized name)")
    else:
        stem = tuned_store.file_name(arch, device_name).removesuffix(".json")
        print(f"msa-tune: will write {out_dir / (stem + '.json')}")
    storage = display_url(args.storage) if args.storage else f"sqlite:///{STUDY_DIR / (stem + '.db')}"
    print(f"msa-tune: studies in {storage}")
    print(f"msa-tune: {len(grid)} buckets, up to {args.trials} trials each")
    for b in grid:
        print(f"  {b.label}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["status"], ["export"]):
        from codegen.tuning import status

        return status.main(argv)
    if argv[:1] == ["warmup"]:
        from codegen import warmup

        return warmup.main(argv[1:])
    if argv[:1] == ["table"]:
        from codegen.tuning import table

        return table.main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a bad argument: its one line is printed already (2)
        return exc.code
    try:
        _check(args)
    except (ValueError, TypeError) as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 2
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    from codegen import tuned_store

    if args.write_defaults:
        from codegen.tuning import publish

        out_path = (args.out or tuned_store.REPO_CONFIG_DIR) / tuned_store.file_name(args.arch, args.write_defaults)
        grid = _grid(args, args.arch, tuned_store.normalize_device_name(args.write_defaults))
        versions = dict(_versions(), cuda=None, hip=None)
        publish.write_defaults(out_path, args.arch, args.write_defaults, grid, versions, argv)
        print(f"msa-tune: wrote unmeasured defaults to {out_path}")
        return 0
    try:
        arch, device_name = _device(args)
    except NoDevice as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 1
    if args.candidates is not None and args.arch == "auto" and arch != "auto":
        try:  # still before anything is touched
            _check_candidates(args.candidates, _grid(args, arch, "check"))
        except (ValueError, TypeError) as exc:
            print(f"msa-tune: {exc}", file=sys.stderr)
            return 2
    if args.list:
        return _list(args, arch, device_name, _grid(args, arch, tuned_store.normalize_device_name(device_name or "-")))
    return _tune(args, argv, arch, device_name)


def _tune(args, argv, arch: str, device_name: str) -> int:
    from codegen import tuned_store
    from codegen.tuning.gpu_lock import new_lock_path, remove_lock
    from codegen.tuning.heartbeats import OptunaIncompatible
    from codegen.tuning.preparer import Preparer
    from codegen.tuning.publish import Publisher
    from codegen.tuning.schedule import results_table, tune_grid
    from codegen.tuning.seeding import seed_configs_from
    from codegen.tuning.settings import TUNER_ID, TuneSettings
    from codegen.tuning.state import TunerState
    from codegen.tuning.storage import StorageUnavailable, default_url, display_url, startup_failure
    from codegen.tuning.worker import DEFAULT_RUNNER, TrialWorker

    versions = _versions()
    device = tuned_store.normalize_device_name(device_name)
    grid = _grid(args, arch, device)
    out_path = (args.out or tuned_store.REPO_CONFIG_DIR) / tuned_store.file_name(arch, device_name)
    storage = args.storage or default_url(out_path.stem)
    if args.seed_from == "auto" and out_path.exists():  # a re-tune starts from the table it replaces
        try:
            args.seed_configs = seed_configs_from(out_path, "--seed-from auto")
        except ValueError as exc:
            print(f"msa-tune: {exc} (--seed-from none: tune without it)", file=sys.stderr)
            return 2
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
        if storage.startswith("sqlite:///"):
            try:
                pathlib.Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageUnavailable(storage, f"cannot create its folder: {exc}", at_startup=True) from None
        state = TunerState(settings, log=log)  # connects now: an unreachable database stops us here
    except (StorageUnavailable, OptunaIncompatible, ValueError) as exc:
        return startup_failure(exc)
    print(f"msa-tune: worker {TUNER_ID}", flush=True)
    worker = TrialWorker(settings.runner, {"TRITON_INTERPRET": "1"} if args.interpret else {})
    preparer = Preparer(workers, static=settings.static_check, precompile=not args.interpret)
    publisher = Publisher(out_path, arch, device_name, versions, argv, args.interpret,
                          workload=dict(decode_context=args.decode_context, prefill_prefix=args.prefill_prefix,
                                        pattern=args.pattern, head_dim=args.head_dim, topk=args.topk))
    started = time.monotonic()
    results: list = []
    try:
        tune_grid(grid, settings, state, worker, preparer, publisher, log=log, results=results)
    except StorageUnavailable as exc:
        print(results_table(results, time.monotonic() - started))
        print(state.report(), flush=True)
        print(f"msa-tune: {exc}", file=sys.stderr, flush=True)
        return 3
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
