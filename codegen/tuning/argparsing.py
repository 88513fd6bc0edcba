"""The msa-tune commands' argument parser and checks: a bad argument is one line naming it on
stderr and exit code 2, found before any study, database or file is touched."""
from __future__ import annotations

import argparse
import pathlib
import sys

DEFAULT_TRIALS = 40  # configs a bucket evaluates without --candidates

USAGE = """msa-tune [options]                 tune (see the options below)
       msa-tune status [--storage URL] ...   per bucket: trials, best, workers alive (status --help)
       msa-tune export [--storage URL] ...   rebuild tuned_configs/*.json from the studies (export --help)
       msa-tune table [FILE ...]             a tuned-config file as a markdown table (table --help)
       msa-tune warmup [--layouts L] ...     compile what the table can pick (warmup --help)"""


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) in every subcommand's format:
    `msa-tune: argument --x: ... (see msa-tune status --help)`."""

    def error(self, message):
        self.exit(2, f"msa-tune: {message} (see {self.prog} --help)\n")

    def parse_or_exit_code(self, argv):
        """(args, None); or (None, the exit code) after --help (0) or a bad argument (2), whose one
        line is printed already: what a subcommand's main returns."""
        try:
            return self.parse_args(argv), None
        except SystemExit as exc:
            return None, exc.code


def items(name: str, text: str) -> list[str]:
    """A comma list's items; an empty one ('1,,2', a trailing comma) is a typo, not nothing."""
    found = text.split(",")
    if not text or any(not item.strip() for item in found):
        raise ValueError(f"{name}: expected a comma list without empty items, got {text!r}")
    return [item.strip() for item in found]


def at_least(name: str, value, low, *, what: str = "a number") -> None:
    """Raises ValueError("--name: expected <what> >= low, got value") unless value >= low."""
    if value is not None and value < low:
        raise ValueError(f"{name}: expected {what} >= {low}, got {value}")


def count_or_all(name: str, text: str) -> int | None:
    """'all' -> None; else an integer >= 1 (ValueError naming the argument otherwise)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer >= 1 or 'all', got {text!r}") from None
    at_least(name, value, 1, what="an integer or 'all'")
    return value


def above(name: str, value, low, *, what: str = "a number") -> None:
    if value is not None and not value > low:
        raise ValueError(f"{name}: expected {what} > {low}, got {value}")


def database_url(name: str, url: str | None) -> None:
    """A URL SQLAlchemy can parse (whether the database answers is found out later, with retries)."""
    if url is None:
        return
    import sqlalchemy.exc as sx
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except sx.ArgumentError:
        # Not echoed: a URL that does not parse may still hold a password.
        raise ValueError(f"{name}: not a database URL SQLAlchemy understands "
                         f"(e.g. sqlite:////abs/path.db, postgresql+psycopg://user@host/db)") from None
    try:  # the dialect's module only: its driver is imported when the run connects
        parsed.get_dialect()
    except sx.ArgumentError:
        raise ValueError(f"{name}: not a database URL SQLAlchemy understands: no dialect {parsed.drivername!r} "
                         f"(e.g. sqlite:////abs/path.db, postgresql+psycopg://user@host/db)") from None


def tune_parser(description: str) -> Parser:
    """msa-tune's own options (tune.py checks their values: _check); `description`: tune.py's docstring."""
    from .. import shapes as S

    p = Parser(prog="msa-tune", description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
               usage=USAGE)
    p.add_argument("--arch", default="auto",
                   help="sm90 | gfx942 | auto (from the GPU; required with --interpret) (default %(default)s)")
    p.add_argument("--interpret", action="store_true",
                   help="run on the CPU under the Triton interpreter: a pipeline test (timings are meaningless), "
                        "on a smoke-sized grid, into an --out folder outside the repository")
    p.add_argument("--interpret-any-size", action="store_true",
                   help="with --interpret: run a grid larger than a smoke run anyway (it may take hours)")
    p.add_argument("--kernels", default="prefill,decode", help="comma list of prefill, decode (default %(default)s)")
    p.add_argument("--modes", default=",".join(f"{m}:{k}" for m, k in S.DEFAULT_MODES),
                   help="comma list of SCALE_MODE:KV_DTYPE (default %(default)s)")
    p.add_argument("--layouts", default=",".join(S.DEFAULT_LAYOUTS),
                   help=f"comma list of head layouts from {sorted(S.HEAD_LAYOUTS)} (default %(default)s)")
    p.add_argument("--decode-buckets", default=",".join(map(str, S.DECODE_BUCKETS)),
                   help="comma list of decode requests per bucket (default %(default)s)")
    p.add_argument("--prefill-buckets", default=",".join(map(str, S.PREFILL_BUCKETS)),
                   help="comma list of prefill chunk tokens per bucket (default %(default)s)")
    p.add_argument("--decode-context", type=int, default=8192,
                   help="tokens cached per decode request (default %(default)s)")
    p.add_argument("--prefill-prefix", type=int, default=0,
                   help="cached prefix before the prefill chunk (default %(default)s)")
    p.add_argument("--pattern", default="correlated", choices=("correlated", "random"),
                   help="tiled prefill selections: neighbours share blocks (correlated) or not (random) "
                        "(default %(default)s)")
    p.add_argument("--prefill-paths", default="tiled,per_token",
                   help="comma list of prefill launch paths to tune: tiled (block_t searched, --pattern "
                        "selections) and per_token (block_t 1, unrelated selections after a prefix of at least "
                        "4 x topk pages; its own sub-entry per bucket) (default %(default)s)")
    p.add_argument("--head-dim", type=int, default=128, help="a power of two >= 16 (default %(default)s)")
    p.add_argument("--topk", type=int, default=16, help="blocks selected per query row (default %(default)s)")
    p.add_argument("--trials", type=int, default=None,
                   help=f"configs evaluated per bucket (default {DEFAULT_TRIALS}; with --candidates, every listed "
                        "config plus the default: a longer list than --trials is sampled, not measured whole)")
    p.add_argument("--bucket-time", type=float, default=300,
                   help="seconds per bucket before it stops searching (default %(default)s)")
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
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole run; the rest resumes later (default: no limit)")
    p.add_argument("--margin", type=float, default=0.03, help="min confirmed gain over the default (default 3%%)")
    p.add_argument("--trial-timeout", type=float, default=180,
                   help="seconds before a trial counts as hung (default %(default)s)")
    p.add_argument("--storage", default=None,
                   help="Optuna RDB URL (default: sqlite file tune_studies/<arch>__<DEVICE>.db in the repo, resumable)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="config folder, created (and said) if missing (default: the repo's tuned_configs/; "
                        "required with --interpret, outside the repo)")
    p.add_argument("--precompile-workers", type=int, default=None, help="parallel compile processes (default: cores-2, max 12)")
    p.add_argument("--no-static-check", action="store_true",
                   help="skip the ahead-of-time resource check (default: checked on a GPU, skipped with --interpret)")
    p.add_argument("--candidates", default=None,
                   help="JSON list of configs to search instead of the whole space (the default is always added), "
                        'or an object of such lists by table ({"decode/scalar/fp8/16x1": [...], ...}: a table '
                        "left out searches the default alone); @FILE reads the JSON from FILE (default: the whole "
                        "space)")
    p.add_argument("--seed-from", default="auto",
                   help="a tuned-config JSON (e.g. the file before a kernel change): each study tries that "
                        "file's configs for its table first, after the default (they count as trials); 'auto' "
                        "(default): the file this run writes, when it exists, and the file this GPU borrows tables from "
                        "(an H100 the H200's; the own file's tables win); 'none': no seeds")
    p.add_argument("--skip-published", action="store_true",
                   help="leave out the buckets the file this run writes already holds, measured on this GPU with "
                        "these kernels, Triton and workload (not one whose trials ran out of GPU memory): a tune "
                        "whose study database is gone resumes from its table")
    p.add_argument("--runner", default=None, help=argparse.SUPPRESS)  # module:function, for tests
    p.add_argument("--heartbeat", type=int, default=10,
                   help="seconds between trial heartbeats; a trial silent for 3 beats is failed and retried "
                        "(default %(default)s)")
    p.add_argument("--db-retries", type=int, default=5,
                   help="retries of a database call that lost its connection, with backoff 1, 2, 4, ... s "
                        "(default %(default)s); then the worker stops with exit code 3")
    p.add_argument("--db-retry-seconds", type=float, default=30.0,
                   help="at most this long waiting for the database per call (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the search's samplers, mixed with each table's name (default %(default)s)")
    p.add_argument("--list", action="store_true",
                   help="print the buckets, the output file and the study database, then exit (no GPU needed)")
    p.add_argument("--write-defaults", metavar="DEVICE_NAME", default=None,
                   help="no GPU needed: write the arch defaults for DEVICE_NAME (with --arch) as an unmeasured "
                        "file, e.g. for a GPU nobody could tune on yet (default: off)")
    return p


def trials_for(trials: int | None, candidates) -> int:
    """--trials as given, else every candidate of the longest list (by table: already narrowed to the
    run's tables, candidates_for_grid) plus the default the tuner adds (DEFAULT_TRIALS without
    --candidates). A given --trials below that gets a note on stderr."""
    if candidates is None:
        return DEFAULT_TRIALS if trials is None else trials
    lists = candidates.values() if isinstance(candidates, dict) else [candidates]
    every = 1 + max((len(listed) for listed in lists), default=0)
    if trials is None:
        return every
    if trials < every:
        print(f"msa-tune: --trials {trials} is below the {every - 1} candidates of the longest list (plus the "
              "default): those studies sample the list instead of measuring all of it", file=sys.stderr)
    return trials


def candidates_for_grid(candidates: dict, tables: set) -> dict:
    """--candidates given by table, narrowed to this run's `tables`. A list covers tables by purpose and
    --kernels/--modes/--layouts may narrow a run to some of them (one scale mode's re-tune): those are
    left out with a note on stderr. A key that names no table at all, or a list of none of the run's
    tables, is an error."""
    outside = sorted(set(candidates) - tables)
    unknown = [key for key in outside if not _names_a_table(key)]
    if unknown:
        raise ValueError(f"--candidates: {unknown} name no table (kernel/scale_mode/kv_dtype/<q heads>x<kv heads> "
                         f"of a known head layout); this run's tables: {sorted(tables)}")
    if outside and not set(candidates) & tables:
        raise ValueError(f"--candidates: table(s) {outside} are not in this run's grid; expected some of {sorted(tables)}")
    if outside:
        print(f"msa-tune: --candidates: leaving out {len(outside)} table(s) outside this run's grid "
              f"(--kernels, --modes, --layouts): {outside}", file=sys.stderr)
    return {key: configs for key, configs in candidates.items() if key in tables}


def _names_a_table(key: str) -> bool:
    """Whether `key` is a table some run could tune: a well-formed key of a known head layout."""
    from ..shapes import HEAD_LAYOUTS
    from ..tuned_store import SchemaError, parse_table_key

    try:
        *_, num_q_heads, num_kv_heads = parse_table_key(key)
    except SchemaError:
        return False
    return (num_q_heads, num_kv_heads) in HEAD_LAYOUTS.values()
