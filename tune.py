"""msa-tune: tune the MSA kernels' launch parameters on this GPU into tuned_configs/.

For every bucket (kernel x scale mode x KV dtype x head layout x token count) an Optuna study
searches the kernel's launch parameters; every trial runs in an isolated worker on fresh inputs
with a poisoned output, must pass the accuracy gate, and is timed from CUDA-graph replays. A config
replaces the arch default only when a confirmation run shows it faster by --margin. Results go
to tuned_configs/<arch>__<DEVICE>.json (atomic, merged per table), which the runtime loads.

  msa-tune                                   # the default grid on the current GPU
  msa-tune --list                            # what would be tuned and which file is written
  msa-tune --kernels decode --modes scalar:fp8 --layouts tp4 --decode-buckets 1,64
  msa-tune --storage postgresql+psycopg://user@host/db   # studies shared by workers on many GPUs/hosts
  msa-tune status --storage URL              # per bucket: trials done/running/failed, best, workers alive
  msa-tune export --storage URL              # rebuild tuned_configs/*.json from the finished studies
  msa-tune table [FILE]                      # a tuned-config file as a markdown table

Any number of workers may run the same command against one --storage (one process per GPU, on one
host or many): each bucket's study is worked by whoever is free, no config is measured twice, and
the worker that finishes a bucket's confirmation writes it to the JSON (docs/multi-gpu-tuning.md).
Exit codes: 0 done, 2 bad arguments, 3 the study database cannot be reached or was lost.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent


def _parser() -> argparse.ArgumentParser:
    from codegen.tuning import buckets as B

    p = argparse.ArgumentParser(prog="msa-tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="auto", help="sm90 | gfx942 | auto (from the GPU; required with --interpret)")
    p.add_argument("--interpret", action="store_true",
                   help="run on the CPU under the Triton interpreter (pipeline test; timings are meaningless)")
    p.add_argument("--kernels", default="prefill,decode", help="comma list of prefill, decode")
    p.add_argument("--modes", default=",".join(f"{m}:{k}" for m, k in B.DEFAULT_MODES),
                   help="comma list of SCALE_MODE:KV_DTYPE (default %(default)s)")
    p.add_argument("--layouts", default=",".join(B.DEFAULT_LAYOUTS), help=f"head layouts from {sorted(B.HEAD_LAYOUTS)}")
    p.add_argument("--decode-buckets", default=",".join(map(str, B.DECODE_BUCKETS)), help="decode requests per bucket")
    p.add_argument("--prefill-buckets", default=",".join(map(str, B.PREFILL_BUCKETS)), help="prefill chunk tokens")
    p.add_argument("--decode-context", type=int, default=8192, help="tokens cached per decode request")
    p.add_argument("--prefill-prefix", type=int, default=0, help="cached prefix before the prefill chunk")
    p.add_argument("--pattern", default="correlated", choices=("correlated", "random"),
                   help="prefill selections: neighbours share blocks (correlated) or not (random)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--topk", type=int, default=16)
    p.add_argument("--trials", type=int, default=40, help="configs evaluated per bucket (default %(default)s)")
    p.add_argument("--bucket-time", type=float, default=300, help="seconds per bucket before it stops searching")
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run; the rest resumes later")
    p.add_argument("--margin", type=float, default=0.03, help="min confirmed gain over the default (default 3%%)")
    p.add_argument("--trial-timeout", type=float, default=180, help="seconds before a trial counts as hung")
    p.add_argument("--storage", default=None,
                   help="Optuna RDB URL (default: sqlite file tune_studies/<arch>__<DEVICE>.db, resumable)")
    p.add_argument("--out", type=pathlib.Path, default=None, help="config folder (default: the repo's tuned_configs/)")
    p.add_argument("--precompile-workers", type=int, default=None, help="parallel compile processes (default: cores-2, max 12)")
    p.add_argument("--no-static-check", action="store_true", help="skip the ahead-of-time resource check")
    p.add_argument("--candidates", default=None,
                   help="JSON list of configs to search instead of the whole space (the default is always added)")
    p.add_argument("--runner", default=None, help=argparse.SUPPRESS)  # module:function, for tests
    p.add_argument("--heartbeat", type=int, default=10,
                   help="seconds between trial heartbeats; a trial silent for 3 beats is failed and retried")
    p.add_argument("--db-retries", type=int, default=5,
                   help="retries of a database call that lost its connection, with backoff 1, 2, 4, ... s "
                        "(default %(default)s); then the worker stops with exit code 3")
    p.add_argument("--db-retry-seconds", type=float, default=30.0,
                   help="at most this long waiting for the database per call (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="print the buckets and the output file, then exit")
    p.add_argument("--write-defaults", metavar="DEVICE_NAME", default=None,
                   help="no GPU needed: write the arch defaults for DEVICE_NAME (with --arch) as an unmeasured "
                        "file, e.g. for a GPU nobody could tune on yet")
    return p


def _write_defaults(args, grid_fn) -> int:
    """An unmeasured tuned-config file: every table and bucket holds the arch default, and its
    provenance says so (the loader then reports is_tuned=False)."""
    import torch
    import triton

    from codegen import tuned_store
    from codegen.loader import current_inputs_sha256
    from codegen.tuning.space import default_for

    if args.arch not in ("sm90", "gfx942"):
        raise SystemExit("msa-tune: --write-defaults needs --arch sm90 or --arch gfx942")
    out_path = (args.out or tuned_store.REPO_CONFIG_DIR) / tuned_store.file_name(args.arch, args.write_defaults)
    doc = tuned_store.new_document(args.arch, args.write_defaults)
    for b in grid_fn(args.arch, tuned_store.normalize_device_name(args.write_defaults)):
        table = doc["tables"].setdefault(b.table_key, {"provenance": _provenance(
            measured=False, gpu_name=args.write_defaults, arch=args.arch,
            inputs=current_inputs_sha256(args.arch, b.kernel, b.scale_mode),
            versions=dict(triton=triton.__version__, torch=torch.__version__, cuda=None, hip=None), argv=sys.argv[1:],
            note="not measured: no such GPU was available; every bucket holds the arch default"), "buckets": {}})
        table["buckets"][str(b.tokens)] = dict(config=default_for(b).to_dict(), is_default=True, default_us=None,
                                               tuned_us=None, trials=0, failures=0)
    tuned_store.write_document(out_path, doc)
    print(f"msa-tune: wrote unmeasured defaults to {out_path}")
    return 0


def _device(args) -> tuple[str, str, dict]:
    """(arch, device name, versions) of where trials run."""
    import torch
    import triton

    versions = dict(triton=triton.__version__, torch=torch.__version__, cuda=torch.version.cuda,
                    hip=getattr(torch.version, "hip", None))
    if args.interpret:
        if args.arch == "auto":
            raise SystemExit("msa-tune: --interpret needs --arch sm90 or --arch gfx942")
        return args.arch, "cpu-interpreter", versions
    if not torch.cuda.is_available():
        raise SystemExit("msa-tune: no GPU found. Tune on the GPU you serve on, or run a pipeline test with "
                         "--interpret --arch sm90 (timings then mean nothing).")
    from codegen.validate import detect_device_arch

    arch = detect_device_arch(torch.device("cuda"))
    if args.arch not in ("auto", arch):
        raise SystemExit(f"msa-tune: --arch {args.arch} does not match this GPU ({arch})")
    return arch, torch.cuda.get_device_name(), versions


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["status"], ["export"]):
        from codegen.tuning import status

        return status.main(argv)
    if argv[:1] == ["table"]:
        from codegen.tuning import table

        return table.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    from codegen import tuned_store
    from codegen.loader import current_inputs_sha256
    from codegen.tuning import buckets as B
    from codegen.tuning.storage import StorageUnavailable, display_url, startup_failure
    from codegen.tuning.study import BUSY, TUNER_ID, BucketResult, Preparer, TunerState, TuneSettings, tune_bucket
    from codegen.tuning.worker import DEFAULT_RUNNER, TrialWorker

    def grid_for(arch, device):
        kernels = [k for k in args.kernels.split(",") if k]
        if not kernels or any(k not in ("prefill", "decode") for k in kernels):
            raise ValueError(f"--kernels: expected a comma list of prefill, decode; got {args.kernels!r}")
        grid = B.grid(arch=arch, device=device, kernels=kernels, modes=B.parse_modes(args.modes),
                      layouts=[x for x in args.layouts.split(",") if x],
                      decode_buckets=B.parse_ints(args.decode_buckets, "--decode-buckets"),
                      prefill_buckets=B.parse_ints(args.prefill_buckets, "--prefill-buckets"),
                      decode_context=args.decode_context, prefill_prefix=args.prefill_prefix, pattern=args.pattern)
        return [dataclasses.replace(b, head_dim=args.head_dim, topk=args.topk) for b in grid]

    if args.write_defaults:
        return _write_defaults(args, grid_for)
    try:
        arch, device_name, versions = _device(args)
        device = tuned_store.normalize_device_name(device_name)
        grid = grid_for(arch, device)
        candidates = None
        if args.candidates:
            from codegen.configs import LaunchConfig

            candidates = [LaunchConfig.from_dict(c, what="--candidates[]") for c in json.loads(args.candidates)]
        if args.db_retries < 0 or args.db_retry_seconds < 0 or args.heartbeat < 1:
            raise ValueError("--db-retries and --db-retry-seconds must be >= 0, --heartbeat >= 1")
    except (ValueError, TypeError) as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 2
    out_dir = args.out or tuned_store.REPO_CONFIG_DIR
    out_path = out_dir / tuned_store.file_name(arch, device_name)
    storage = args.storage or f"sqlite:///{pathlib.Path('tune_studies').resolve() / (out_path.stem + '.db')}"
    print(f"msa-tune: {device_name} ({arch}, normalized {device}), triton {versions['triton']}, torch {versions['torch']}")
    print(f"msa-tune: will write {out_path}")
    print(f"msa-tune: studies in {display_url(storage)}")
    print(f"msa-tune: {len(grid)} buckets, up to {args.trials} trials each")
    if args.list:
        for b in grid:
            print(f"  {b.label}")
        return 0

    workers = args.precompile_workers
    if workers is None:
        workers = 0 if args.interpret else max(1, min(12, (os.cpu_count() or 2) - 2))
    settings = TuneSettings(storage=storage, trials=args.trials, bucket_time_s=args.bucket_time, margin=args.margin,
                            trial_timeout_s=args.trial_timeout, interpret=args.interpret,
                            precompile_workers=workers, runner=args.runner or DEFAULT_RUNNER,
                            static_check=not args.no_static_check and not args.interpret, seed=args.seed,
                            heartbeat_s=args.heartbeat,
                            deadline=(time.monotonic() + args.time_budget) if args.time_budget else None,
                            candidates=candidates, db_retries=args.db_retries, db_retry_s=args.db_retry_seconds)
    log = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if storage.startswith("sqlite:///"):
            try:
                pathlib.Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageUnavailable(storage, f"cannot create its folder: {exc}", at_startup=True) from None
        state = TunerState(settings, log=log)  # connects now: an unreachable database stops us here
    except (StorageUnavailable, ValueError) as exc:
        return startup_failure(exc)
    print(f"msa-tune: worker {TUNER_ID}", flush=True)
    env = {"TRITON_INTERPRET": "1"} if args.interpret else {}
    worker = TrialWorker(settings.runner, env)
    preparer = Preparer(workers, static=settings.static_check, precompile=not args.interpret)
    started = time.monotonic()
    results: list[BucketResult] = []
    pending = list(enumerate(grid, 1))
    announced: set[int] = set()
    try:
        while pending:
            progressed = False
            for item in list(pending):
                i, bucket = item
                if settings.deadline and time.monotonic() > settings.deadline:
                    break
                inputs = current_inputs_sha256(arch, bucket.kernel, bucket.scale_mode)  # from the loaded modules
                if i not in announced:
                    announced.add(i)
                    print(f"[{i}/{len(grid)}] {bucket.label}", flush=True)
                publish = functools.partial(_write, out_path, arch, device_name, inputs=inputs, versions=versions,
                                            args=args, argv=argv)
                outcome = tune_bucket(bucket, bucket.study_name(inputs, versions["triton"]), settings, worker,
                                      preparer, log=log, state=state, publish=publish,
                                      neighbours=functools.partial(_neighbour_configs, out_path, bucket))
                if outcome == BUSY:
                    continue
                pending.remove(item)
                progressed = True
                if isinstance(outcome, BucketResult):
                    results.append(outcome)
                else:
                    print(f"  {bucket.label}: already finished (by another worker or an earlier run)", flush=True)
            if pending and settings.deadline and time.monotonic() > settings.deadline:
                print(f"msa-tune: time budget spent with {len(pending)}/{len(grid)} buckets left; "
                      f"re-run the same command to resume", flush=True)
                break
            if pending and not progressed:  # every bucket left is in other workers' hands: look again soon
                time.sleep(min(1.0, settings.heartbeat_s))
    except StorageUnavailable as exc:
        print(_table(results, time.monotonic() - started))
        print(state.report(), flush=True)
        print(f"msa-tune: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        worker.close()
        preparer.close()
        state.close()
    print(_table(results, time.monotonic() - started))
    print(state.report(), flush=True)
    return 0


def _provenance(*, measured: bool, gpu_name: str, arch: str, inputs: str, versions: dict, argv, **extra) -> dict:
    """A table's provenance (docs/tuned-configs.md): where, with what and by which command."""
    return dict(measured=measured, gpu_name=gpu_name, arch=arch, inputs_sha256=inputs,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="msa-tune " + " ".join(argv), **versions, **extra)


def _neighbour_configs(out_path, bucket, count: int = 2) -> list:
    """Configs chosen (not the default) for the `count` buckets of this table nearest to `bucket` in
    log2 tokens, from the file this run writes; none when it does not exist or cannot be read."""
    from codegen import tuned_store
    from codegen.configs import LaunchConfig
    from codegen.loader import buckets_by_distance

    try:
        table = tuned_store.read_document(out_path)["tables"].get(bucket.table_key, {})
    except (OSError, ValueError):
        return []
    chosen = {int(tokens): entry for tokens, entry in table.get("buckets", {}).items()
              if int(tokens) != bucket.tokens and not entry.get("is_default")}
    configs = []
    for tokens in buckets_by_distance(chosen, bucket.tokens)[:count]:
        try:
            configs.append(LaunchConfig.from_dict(chosen[tokens]["config"]))
        except (TypeError, ValueError):
            continue
    return configs


def _write(out_path, arch, device_name, result, *, inputs, versions, args, argv) -> dict:
    """Writes a finished bucket into the JSON (atomic, under a lock); returns what was written, which
    the study keeps as its result (`msa-tune export` rebuilds the JSON from those)."""
    from codegen import tuned_store

    provenance = _provenance(measured=True, gpu_name=device_name, arch=arch, inputs=inputs, versions=versions,
                             argv=argv,
                             timing=("Triton interpreter wall clock: meaningless as a speed" if args.interpret else
                                     "CUDA graph of up to 20 calls on rotating inputs, replay time / calls, median"),
                             workload=dict(decode_context=args.decode_context, prefill_prefix=args.prefill_prefix,
                                           pattern=args.pattern, head_dim=args.head_dim, topk=args.topk))
    bucket = result.bucket
    entry = dict(config=result.config.to_dict(), is_default=result.is_default, default_us=result.default_us,
                 tuned_us=result.tuned_us, trials=result.trials, failures=result.failures,
                 failure_kinds=result.failure_kinds, note=result.note, study=result.study_name)
    tuned_store.update_table(out_path, arch, device_name, bucket.table_key, provenance, {str(bucket.tokens): entry})
    print(f"msa-tune: wrote {bucket.label} to {out_path}", flush=True)
    return dict(arch=arch, device_name=device_name, table_key=bucket.table_key, tokens=bucket.tokens,
                entry=entry, provenance=provenance)


def _table(results, elapsed_s: float) -> str:
    lines = [f"{'bucket':40s} {'default us':>11s} {'tuned us':>10s} {'speedup':>8s} {'trials':>6s} {'failed':>6s}  config"]
    for r in results:
        fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
        speed = f"{r.speedup:.2f}x" if r.speedup else "-"
        conf = "default" if r.is_default else ",".join(f"{k}={v}" for k, v in r.config.non_default().items())
        lines.append(f"{r.bucket.label:40s} {fmt(r.default_us):>11s} {fmt(r.tuned_us):>10s} {speed:>8s} "
                     f"{r.trials:6d} {r.failures:6d}  {conf}")
    lines.append(f"{len(results)} buckets in {elapsed_s:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
