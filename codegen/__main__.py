"""Command line: `python -m codegen render [--check]`."""
from __future__ import annotations

import argparse
import sys

from . import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_render = sub.add_parser("render", help="render templates/ into codegen/generated/")
    p_render.add_argument("--check", action="store_true", help="write nothing; exit 1 if a module drifted")
    args = parser.parse_args(argv)

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
