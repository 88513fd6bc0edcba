"""Command line of the static resource gates (codegen.static).

  python -m codegen.static_cli compile --arch sm90 --kernel prefill --scale-mode scalar --kv-dtype fp8 \\
      --heads 16/1 --config '{"block_n": 64}'
      One kernel (prefill | prefill_ws | decode_split | decode_merge) or one runtime call (decode =
      split + merge): prints its resource report. Exit 1 when it breaks a limit or spills. --unfolded
      compiles the unfolded scalar baseline module (<variant>_unfolded; --scale-mode scalar only).
      prefill_ws is the warp-specialized Gluon tile (sm90, --scale-mode scalar | per_token_head, fp8):
      its --config fields go over configs.ws_config for the heads' GQA, e.g. '{"convert_rows": 16}'.
  python -m codegen.static_cli report [--json out.json] [--markdown out.md] [--jobs N] [--no-cache]
      Every shipped (module, config): compiles in parallel, prints the table. Exit 1 when a launch has
      a problem that static_exceptions.json does not list.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from . import static
from .configs import ws_config

_COMPILE_KERNELS = ("prefill", "prefill_ws", "decode_split", "decode_merge", "decode")


def _heads(text: str) -> tuple[int, int]:
    try:
        hq, hkv = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--heads: expected <q heads>/<kv heads> such as 16/1, got {text!r}") from None
    return hq, hkv


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m codegen.static_cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    one = sub.add_parser("compile", help="compile one kernel or runtime call and print its resource report")
    one.add_argument("--arch", required=True, choices=sorted(static.LIMITS))
    one.add_argument("--kernel", required=True, choices=_COMPILE_KERNELS)
    one.add_argument("--scale-mode", required=True)
    one.add_argument("--kv-dtype", required=True, choices=static.KV_DTYPES)
    one.add_argument("--heads", required=True, type=_heads, help="q heads / kv heads, e.g. 64/4")
    one.add_argument("--config", type=_json_object, default={},
                     help="LaunchConfig fields as JSON (others default; prefill_ws: configs.ws_config's)")
    one.add_argument("--options", type=_json_object, default=None,
                     help="extra compile options as JSON, checked against the backend's option names")
    one.add_argument("--head-dim", type=int, default=128)
    one.add_argument("--topk", type=int, default=16)
    one.add_argument("--q-dtype", default="bf16", choices=sorted(static.Q_DTYPES))
    one.add_argument("--varlen", action="store_true", help="decode: compile the varlen variant")
    one.add_argument("--unfolded", action="store_true",
                     help="the unfolded scalar-scale baseline module (fold_scales=False; --scale-mode scalar only)")
    one.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    one.add_argument("--no-cache", action="store_true", help="compile even when the figures are cached")

    many = sub.add_parser("report", help="compile every shipped kernel and config, print the table")
    many.add_argument("--json", dest="json_path", help="also write the rows as JSON here")
    many.add_argument("--markdown", dest="markdown_path", help="also write the table as Markdown here")
    many.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per core)")
    many.add_argument("--no-cache", action="store_true", help="compile everything, ignoring cached figures")
    return parser


def _print_report(report: static.ResourceReport) -> None:
    limits = static.LIMITS[report.arch]
    regs = f"{report.registers}"
    if report.arch == "gfx942":
        regs += f" (arch VGPR {report.vgpr}, AGPR {report.agpr})"
    lines = [
        ("registers", f"{regs}   (limit {limits.registers} {limits.register_unit})"),
        ("spill", f"{report.spill} {report.spill_unit}"),
        ("scratch", f"{report.scratch_bytes} B"),
        (limits.shared_name, f"{report.shared_bytes} B   (limit {limits.shared_bytes} B)"),
        ("occupancy", "-" if report.occupancy is None else str(report.occupancy)),
        ("mma", report.mma),
        *((key, str(value)) for key, value in report.extra.items()),
    ]
    print(f"{report.launch_id}  (triton {report.triton_version}{', cached' if report.cached else ''})")
    for label, value in lines:
        print(f"  {label:<24} {value}")
    for note in report.notes:
        print(f"  note: {note}")
    print("  " + ("ok" if report.ok else "PROBLEMS:\n    " + "\n    ".join(report.problems)))


def _config(args) -> dict:
    """--config's fields; for prefill_ws over the warp-specialized tile's config for the heads' GQA
    (its fixed fields and block_t are then right without being spelled out)."""
    if args.kernel != "prefill_ws":
        return args.config
    hq, hkv = args.heads
    if min(hq, hkv) < 1 or hq % hkv:
        raise ValueError(f"--heads: expected q heads a multiple of kv heads, got {hq}/{hkv}")
    return {**ws_config(gqa=hq // hkv).to_dict(), **args.config}


def _run_compile(args) -> int:
    hq, hkv = args.heads
    config = _config(args)
    common = dict(head_dim=args.head_dim, topk=args.topk, q_dtype=args.q_dtype, varlen=args.varlen,
                  options=args.options, use_cache=not args.no_cache, fold_scales=not args.unfolded)
    if args.kernel == "decode":
        reports = static.check_launch(args.arch, "decode", args.scale_mode, args.kv_dtype, hq, hkv, config,
                                      **common)
    else:
        reports = [static.compile_report(args.arch, args.kernel, args.scale_mode, args.kv_dtype, hq, hkv,
                                         config, **common)]
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1, sort_keys=True, default=str))
    else:
        for report in reports:
            _print_report(report)
    return 0 if all(r.ok for r in reports) else 1


def _markdown(table: str, command: str) -> str:
    return ("# Static resource report\n\n"
            "Every shipped generated kernel (the unfolded scalar baselines included) with its arch default "
            "config (and every config in `tuned_configs/`), compiled ahead of time on a CPU for sm90 "
            "(`GPUTarget(\"cuda\", 90, 32)`) and gfx942 (`GPUTarget(\"hip\", \"gfx942\", 64)`), with triton "
            f"{static.triton.__version__} (torch {static.torch.__version__}). The CI gate compiles with the triton "
            "of `requirements-static.txt` (`.venv-static`), the version the GPU machines run and tune with; "
            "figures differ between Triton versions.\n\n"
            f"Produced by `{command}`.\n\n" + table)


def _interpreter() -> str:
    """How to name this interpreter in a reproducible command: relative to the repo when inside it."""
    exe = os.path.abspath(sys.executable)
    root = str(static.REPO_ROOT) + os.sep
    return exe[len(root):] if exe.startswith(root) else "python"


def _run_report(args, argv: list[str]) -> int:
    command = f"{_interpreter()} -m codegen.static_cli " + " ".join(shlex.quote(a) for a in argv)
    rows, table = static.report(jobs=args.jobs, use_cache=not args.no_cache)
    print(table, end="")
    if args.json_path:
        static.write_json(args.json_path, rows, command=command)
    if args.markdown_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown_path)), exist_ok=True)
        with open(args.markdown_path, "w") as f:
            f.write(_markdown(table, command))
    failed = [row for row in rows if row["status"] == "FAIL"]
    counts = {status: sum(row["status"] == status for row in rows) for status in ("ok", "excepted", "FAIL")}
    print(f"\n{len(rows)} compiles: {counts['ok']} ok, {counts['excepted']} excepted, {counts['FAIL']} failing")
    for row in failed:
        print(f"FAIL {row['launch_id']}: {'; '.join(row['unexcused_problems'])}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    try:
        if args.command == "compile":
            return _run_compile(args)
        return _run_report(args, argv)
    except (TypeError, ValueError) as exc:  # bad arguments: say which, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
