"""What msa-tune --interpret (the CPU, no GPU) may run: a pipeline test, not a tune.

A kernel call under the Triton interpreter takes seconds, so the default grid (hundreds of buckets
of 40 trials at head_dim 128) would run for hours, and its timings mean nothing. So under
--interpret a grid larger than a smoke run needs --interpret-any-size, and --out must be a folder
outside the repository: a CPU table in tuned_configs/ would be what the runtime loads for
"cpu-interpreter" (changing what the README's examples print) and would show in `git status`.
"""
from __future__ import annotations

import pathlib

# The run scripts/tune.sh makes without a GPU (tests/interp/test_cli.py checks that they agree).
SMOKE_ARGS = ("--interpret", "--arch", "sm90", "--kernels", "decode", "--modes", "scalar:fp8", "--layouts", "tp8",
              "--decode-buckets", "2", "--decode-context", "300", "--head-dim", "32", "--topk", "4", "--trials", "4")
SMOKE_COMMAND = "msa-tune " + " ".join(SMOKE_ARGS) + " --out DIR --storage sqlite:///DIR/study.db"
SUGGESTION = f"the smoke run of bash scripts/tune.sh is: {SMOKE_COMMAND}"

# A smoke run: a few small buckets, a few minutes on a CPU core (the tests' runs all fit).
MAX_BUCKETS, MAX_TRIALS, MAX_TOKENS, MAX_HEAD_DIM, MAX_TOPK, MAX_CONTEXT = 4, 20, 64, 64, 8, 1024


def check_out(out: pathlib.Path | None, repo: pathlib.Path) -> None:
    """Under --interpret, --out is required and outside the repository (ValueError naming it)."""
    if out is None:
        raise ValueError(f"--out: --interpret needs a folder outside the repository (its CPU table must not land "
                         f"in tuned_configs/, which the runtime loads); {SUGGESTION}")
    resolved = out.resolve()
    if resolved == repo or repo in resolved.parents:
        raise ValueError(f"--out: --interpret needs a folder outside the repository {repo}, got {out}; {SUGGESTION}")


def oversize(args, grid) -> list[str]:
    """What makes this run larger than a smoke run (empty: it is one)."""
    tokens = max((b.tokens for b in grid), default=0)
    found = [(len(grid), MAX_BUCKETS, f"{len(grid)} buckets"), (args.trials, MAX_TRIALS, f"--trials {args.trials}"),
             (tokens, MAX_TOKENS, f"a bucket of {tokens} tokens"),
             (args.head_dim, MAX_HEAD_DIM, f"--head-dim {args.head_dim}"), (args.topk, MAX_TOPK, f"--topk {args.topk}"),
             (args.decode_context, MAX_CONTEXT, f"--decode-context {args.decode_context}"),
             (args.prefill_prefix, MAX_CONTEXT, f"--prefill-prefix {args.prefill_prefix}")]
    return [f"{text} > {limit}" for value, limit, text in found if value > limit]


def check_size(args, grid) -> None:
    """Under --interpret, a grid larger than a smoke run is refused unless --interpret-any-size."""
    over = oversize(args, grid)
    if over and not args.interpret_any_size:
        raise ValueError(f"--interpret: this grid would run for hours under the interpreter ({', '.join(over)}); "
                         f"{SUGGESTION} (--interpret-any-size runs it anyway)")
