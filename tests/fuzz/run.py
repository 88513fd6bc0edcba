"""The randomized differential tester's command (issue 35).

  python -m tests.fuzz.run --seconds 150 [--workers N] [--first-seed S] [--min-cases M]
  python -m tests.fuzz.run --seed N            # one case alone, e.g. a failure's
  python -m tests.fuzz.run --profile cpu ...   # the interpreter's small cases (no GPU)

Draws seeded cases (tests/fuzz/draw.py; seeds 0-8 are issue 35's class: per_token_head over an
unaligned cache, every selection path, 8/1, 16/1 and 64/4 heads) for a fixed time in N worker
processes sharing the GPU (worker i takes seeds S + i, S + i + N, ...), prints a line per case with
its seed, and a summary. A case that ran out of GPU memory beside the other workers is run again
alone once they are done, and judged by that run (its cases reach ~16 GiB at peak, so a dozen
workers can fill an 80 GB card whatever the kernels do). Exits 1 on any failed case, a worker that
died or hung (its last seed is named), or fewer than --min-cases cases; 2 on a bad argument."""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time

GRACE_SECONDS = 90  # a case started just before the deadline may compile and run this long
# GPU memory a worker is given by the default worker count: the largest case peaked at 16.3 GiB, a
# typical one at 3-8 (H100 80 GB, 12 workers, 2026-12-07: 27 of 1918 cases ran out of memory).
GIB_PER_WORKER = 10
MAX_WORKERS = 12
OOM = "OutOfMemoryError"


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="draw new cases for this long (default 150)")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"processes (default: on a GPU one per {GIB_PER_WORKER} GiB of its memory, at most "
                             f"{MAX_WORKERS} and at most the CPU count; 1 on a CPU)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="run this one case alone")
    parser.add_argument("--min-cases", type=int, default=1, help="fail with fewer cases (default 1)")
    parser.add_argument("--profile", choices=("gpu", "cpu"), default=None,
                        help="gpu: the serving space; cpu: small interpreter cases (default: gpu if one is visible)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rerun", default=None, help=argparse.SUPPRESS)  # comma list of seeds, one process
    args = parser.parse_args(argv)
    for name in ("seconds", "workers", "min_cases"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "min_cases" else 1e-9):
            parser.exit(2, f"tests.fuzz.run: --{name.replace('_', '-')}: expected a positive number, got {value}\n")
    for name in ("first_seed", "seed"):
        value = getattr(args, name)
        if value is not None and value < 0:
            parser.exit(2, f"tests.fuzz.run: --{name.replace('_', '-')}: expected a seed >= 0, got {value}\n")
    return args


def _setup(profile: str | None) -> tuple[str, str]:
    """(profile, device), with TRITON_INTERPRET set before codegen is imported for the CPU profile."""
    if profile == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return profile, "cpu"
    import torch

    if not torch.cuda.is_available():
        if profile == "gpu":
            sys.exit("tests.fuzz.run: --profile gpu needs a GPU; none is visible")
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu", "cpu"
    return "gpu", "cuda"


def _seeds(args):
    """The worker's seeds: the listed ones (a re-run), else first_seed + worker, step workers, until the deadline."""
    if args.rerun is not None:
        yield from (int(seed) for seed in args.rerun.split(","))
        return
    deadline = time.monotonic() + args.seconds
    seed = args.first_seed + args.worker
    while time.monotonic() < deadline:
        yield seed
        seed += args.workers


def _worker(args) -> int:
    """Runs its seeds (_seeds); a JSON line per case."""
    profile, device = _setup(args.profile)
    import warnings

    from .check import run_case

    warnings.simplefilter("ignore")  # the API's fallback notices: said once per process, not failures
    for seed in _seeds(args):
        print(json.dumps({"start": seed}), flush=True)
        result = run_case(seed, profile, device)
        print(json.dumps(result.__dict__), flush=True)
        if "CUDA error" in result.failure or "illegal" in result.failure:
            return 3  # the context is lost: every later case here would fail for this one's sake
    return 0


def _one(args) -> int:
    profile, device = _setup(args.profile)
    from .check import run_case
    from .draw import draw

    print(draw(args.seed, profile))
    result = run_case(args.seed, profile, device)
    print(result.line())
    return 0 if result.ok else 1


def _pump(index, proc, lines, last_start, lock):
    for raw in proc.stdout:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:  # a warning or a crash's words: passed through
            with lock:
                print(f"[worker {index}] {raw.rstrip()}", flush=True)
            continue
        with lock:
            if "start" in record:
                last_start[index] = record["start"]
            else:
                last_start[index] = None
                lines.append(record)
                from .check import Result

                print(Result(**record).line(), flush=True)


def _default_workers(gpu: bool) -> int:
    if not gpu:
        return 1
    import torch

    gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2 ** 30
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1, int(gib // GIB_PER_WORKER)))


def _pool(commands, env, seconds) -> tuple[list, list]:
    """Runs the worker commands at once for `seconds` (then kills them): (case records, deaths)."""
    start = time.monotonic()
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for command in commands]
    lines, last_start, lock = [], {}, threading.Lock()
    pumps = [threading.Thread(target=_pump, args=(i, p, lines, last_start, lock), daemon=True)
             for i, p in enumerate(procs)]
    for pump in pumps:
        pump.start()
    died = []
    for i, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=max(1.0, seconds - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "hung"
        pumps[i].join(timeout=5)
        if rc != 0:
            died.append(f"worker {i} ended with {rc} during seed {last_start.get(i)}")
    return lines, died


def main(argv=None) -> int:
    args = _parse(argv)
    if args.seed is not None:
        return _one(args)
    if args.worker is not None:
        return _worker(args)
    import torch

    gpu = torch.cuda.is_available() and args.profile != "cpu"
    workers = args.workers or _default_workers(gpu)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // workers)), PYTHONUNBUFFERED="1")
    base = [sys.executable, "-m", "tests.fuzz.run", "--seconds", str(args.seconds), "--workers", str(workers),
            "--first-seed", str(args.first_seed)] + (["--profile", args.profile] if args.profile else [])
    print(f"tests.fuzz.run: {workers} worker(s), {args.seconds:.0f} s of new cases, seeds from {args.first_seed}, "
          f"profile {args.profile or ('gpu' if gpu else 'cpu')}", flush=True)
    start = time.monotonic()
    lines, died = _pool([base + ["--worker", str(i)] for i in range(workers)], env, args.seconds + GRACE_SECONDS)
    # Judged by a run alone, where the other workers' memory is free again (one worker: it already was).
    crowded = sorted(r["seed"] for r in lines if not r["ok"] and OOM in r["failure"]) if workers > 1 else []
    if crowded:
        print(f"tests.fuzz.run: {len(crowded)} case(s) ran out of GPU memory beside the other workers; "
              f"running them alone", flush=True)
        rerun = base + ["--worker", "0", "--rerun", ",".join(map(str, crowded))]
        again, died_again = _pool([rerun], env, GRACE_SECONDS + 10 * len(crowded))
        lines = [r for r in lines if r["seed"] not in crowded] + again
        died += [f"re-run {line}" for line in died_again]
    return _summary(lines, died, args.min_cases, time.monotonic() - start, rerun=len(crowded))


def _summary(lines, died, min_cases, seconds, rerun=0) -> int:
    failed = [r for r in lines if not r["ok"]]
    kinds = collections.Counter(r["case"].split(" ")[0] for r in lines)
    worst = max((r["worst_row"] for r in lines if r["ok"]), default=float("nan"))
    closest = max((r["gate"] for r in lines if r["ok"]), default=float("nan"))
    print(f"tests.fuzz.run: {len(lines)} cases ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"{len(failed)} failed, worst passing row rel L2 {worst:.2e}, closest to its gate {closest:.2f}, "
          f"{seconds:.0f} s" + (f", {rerun} re-run alone after running out of GPU memory" if rerun else ""))
    for record in failed:
        print(f"  FAILED seed={record['seed']}: {record['failure'].splitlines()[0] if record['failure'] else ''}")
    for line in died:
        print(f"  DIED {line}")
    if len(lines) < min_cases:
        print(f"  too few cases: {len(lines)} < --min-cases {min_cases}")
    return 1 if failed or died or len(lines) < min_cases else 0


if __name__ == "__main__":
    sys.exit(main())
