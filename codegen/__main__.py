"""Command line: `python -m codegen render [--check]`, `python -m codegen restamp --before REF`."""
from __future__ import annotations

import argparse
import pathlib
import sys

from . import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_render = sub.add_parser("render", help="render templates/ into codegen/generated/")
    p_render.add_argument("--check", action="store_true", help="write nothing; exit 1 if a module drifted")
    p_restamp = sub.add_parser("restamp", help="carry tuned tables whose kernels compile as at --before "
                                               "(codegen/restamp.py; run with the GPU's Triton)")
    p_restamp.add_argument("--before", required=True, help="git ref (or source tree) the tables were fresh at")
    p_restamp.add_argument("--file", type=pathlib.Path, action="append",
                           help="tuned-config file (repeatable; default: every file in tuned_configs/)")
    p_restamp.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    args = parser.parse_args(argv)

    if args.command == "restamp":
        from . import restamp, tuned_store

        files = args.file or sorted(tuned_store.REPO_CONFIG_DIR.glob("*.json"))
        try:
            for path in files:
                for v in restamp.restamp(path, args.before, dry_run=args.dry_run):
                    done = ("passes (dry run)" if args.dry_run else "restamped") if v.restamped else "left"
                    print(f"{path.name} {v.table}: {done} ({v.reason})")
        except ValueError as exc:
            print(f"python -m codegen restamp: {exc}", file=sys.stderr)
            return 2
        return 0

    if args.command == "render":
        if args.check:
            problems = render.drifted()
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                return 1
            print(f"generated modules match templates ({len(render.render_all())} variants)")
            return 0
        written = render.write_all()
        for path in written:
            print(f"wrote {path.relative_to(render.REPO_ROOT)}")
        print(f"{len(written)} module(s) written, {len(render.render_all()) - len(written)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
