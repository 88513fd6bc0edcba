"""`msa-tune warmup`: the command-line front of codegen.warmup. Like the other subcommands, it
checks its arguments before it asks for a GPU: a bad one is one line and exit 2, no GPU exit 1, a
failed compile exit 1 (the README's exit codes)."""
from __future__ import annotations

import sys

from .argparsing import Parser, items


def _parser() -> Parser:
    from ..shapes import DEFAULT_LAYOUTS, DEFAULT_MODES, HEAD_LAYOUTS
    from ..variants import TUNABLE_KERNELS

    p = Parser(prog="msa-tune warmup",
               description="Compile every kernel the tuned table can pick for a model layout into Triton's cache "
                           "(TRITON_CACHE_DIR), so that no request waits for a compile.")
    p.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS),
                   help=f"comma-separated head layouts, of {sorted(HEAD_LAYOUTS)} (default: %(default)s)")
    p.add_argument("--modes", default=",".join(f"{m}:{d}" for m, d in DEFAULT_MODES),
                   help="comma-separated scale_mode:kv_dtype pairs (default: %(default)s)")
    p.add_argument("--kernels", default=",".join(TUNABLE_KERNELS), help="prefill, decode or both "
                   "(default: %(default)s)")
    p.add_argument("--query-lens", default="1", help="decode tokens per request, comma-separated "
                   "(1, or 2..4 with speculative decoding; default: %(default)s)")
    p.add_argument("--max-model-len", type=int, default=131072,
                   help="the server's max_model_len: the block table's width (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None,
                   help="compile processes (default: the CPU count, at most 16)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _arguments(args) -> dict:
    """warmup's keyword arguments from the command line, checked (ValueError naming the option)."""
    from .. import warmup

    query_lens = items("--query-lens", args.query_lens)
    if not all(n.isdigit() for n in query_lens):
        raise ValueError(f"--query-lens: expected comma-separated integers, got {args.query_lens!r}")
    kwargs = dict(layouts=tuple(items("--layouts", args.layouts)),
                  modes=tuple(tuple(pair.split(":")) for pair in items("--modes", args.modes)),
                  kernels=tuple(items("--kernels", args.kernels)), query_lens=tuple(int(n) for n in query_lens),
                  max_model_len=args.max_model_len, workers=args.workers)
    warmup.check_arguments(**kwargs, option=lambda name: "--" + name.replace("_", "-"))
    return kwargs


def main(argv: list[str]) -> int:
    from .. import warmup

    args, code = _parser().parse_or_exit_code(argv)
    if args is None:
        return code
    try:
        kwargs = _arguments(args)
    except ValueError as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 2
    try:
        report = warmup.warmup(**kwargs, progress=not args.quiet)
    except warmup.NoGPU as exc:
        print(f"msa-tune: {exc}", file=sys.stderr)
        return 1
    print(report)
    for description, error in report.failed:
        print(f"  failed: {description}: {error}")
    return 1 if report.failed else 0
