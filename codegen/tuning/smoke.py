"""What msa-tune --interpret (the CPU, no GPU) may run: a pipeline test, not a tune.

A kernel call under the Triton interpreter takes seconds, so the default grid (hundreds of buckets
of 40 trials at head_dim 128) would run for hours, and its timings mean nothing. So under
--interpret a grid larger than a smoke run needs --interpret-any-size, and --out must be a folder
outside the repository: a CPU table in tuned_configs/ would be what the runtime loads for
"cpu-interpreter" (changing what the README's examples print) and would show in `git status`.
Its study database lies outside the repository too (beside --out by default), and its studies
leave out the Gluon tile, which runs only on a GPU (space.bucket_ws_gqa).
"""
from __future__ import annotations

import pathlib

DEVICE = "cpu-interpreter"  # the device name an --interpret run tunes (codegen.api.device_name on a CPU)

# The run scripts/tune.sh makes without a GPU (tests/interp/test_cli.py checks that they agree).
SMOKE_ARGS = ("--interpret", "--arch", "sm90", "--kernels", "decode", "--modes", "scalar:fp8", "--layouts", "tp8",
              "--decode-buckets", "2", "--decode-context", "300", "--head-dim", "32", "--topk", "4", "--trials", "4")
SMOKE_COMMAND = "msa-tune " + " ".join(SMOKE_ARGS) + " --out DIR --storage sqlite:///DIR/study.db"
SUGGESTION = f"the smoke run of bash scripts/tune.sh is: {SMOKE_COMMAND}"

# A smoke run: a few small buckets, a few minutes on a CPU core (the tests' runs all fit).
MAX_BUCKETS, MAX_TRIALS, MAX_TOKENS, MAX_HEAD_DIM, MAX_TOPK, MAX_CONTEXT = 4, 20, 64, 64, 8, 1024


def inside(path: pathlib.Path, repo: pathlib.Path) -> bool:
    resolved = path.resolve()
    return resolved == repo or repo in resolved.parents


def check_out(out: pathlib.Path | None, repo: pathlib.Path) -> None:
    """Under --interpret, --out is required and outside the repository (ValueError naming it)."""
    if out is None:
        raise ValueError(f"--out: --interpret needs a folder outside the repository (its CPU table must not land "
                         f"in tuned_configs/, which the runtime loads); {SUGGESTION}")
    if inside(out, repo):
        raise ValueError(f"--out: --interpret needs a folder outside the repository {repo}, got {out}; {SUGGESTION}")


def check_storage(url: str | None, repo: pathlib.Path) -> None:
    """Under --interpret, an SQLite --storage lies outside the repository too: a finished smoke study
    in tune_studies/ leaves the next smoke run nothing to do, and `msa-tune status` would show it."""
    from .outputs import sqlite_file

    path = sqlite_file(url) if url else None
    if path is not None and inside(path, repo):
        raise ValueError(f"--storage: --interpret keeps its studies outside the repository {repo}, got {path}; "
                         f"{SUGGESTION}")


def check_candidates(candidates) -> None:
    """The Gluon tile (warp_specialize=1) does not run under the Triton interpreter: not a candidate there."""
    listed = candidates.items() if isinstance(candidates, dict) else [("", candidates or [])]
    for table, configs in listed:
        for i, config in enumerate(configs):
            if config.warp_specialize:
                where = f"--candidates[{table!r}][{i}]" if table else f"--candidates[{i}]"
                raise ValueError(f"{where}: warp_specialize=1 (the Gluon tile) needs a GPU; --interpret runs the "
                                 f"Triton interpreter")


def oversize(args, grid) -> list[str]:
    """What makes this run larger than a smoke run (empty: it is one)."""
    tokens = max((b.tokens for b in grid), default=0)
    kernels = {b.kernel for b in grid}
    found = [(len(grid), MAX_BUCKETS, f"{len(grid)} buckets"), (args.trials, MAX_TRIALS, f"--trials {args.trials}"),
             (tokens, MAX_TOKENS, f"a bucket of {tokens} tokens"),
             (args.head_dim, MAX_HEAD_DIM, f"--head-dim {args.head_dim}"), (args.topk, MAX_TOPK, f"--topk {args.topk}")]
    # A kernel's own setting counts only when the grid runs that kernel (its default is no smoke size).
    if "decode" in kernels:
        found.append((args.decode_context, MAX_CONTEXT, f"--decode-context {args.decode_context}"))
    if "prefill" in kernels:
        found.append((args.prefill_prefix, MAX_CONTEXT, f"--prefill-prefix {args.prefill_prefix}"))
    return [f"{text} > {limit}" for value, limit, text in found if value > limit]


def check_size(args, grid) -> None:
    """Under --interpret, a grid larger than a smoke run is refused unless --interpret-any-size."""
    over = oversize(args, grid)
    if over and not args.interpret_any_size:
        raise ValueError(f"--interpret: this grid would run for hours under the interpreter ({', '.join(over)}); "
                         f"{SUGGESTION} (--interpret-any-size runs it anyway)")
