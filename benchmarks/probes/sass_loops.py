"""SASS instructions per iteration of a kernel's loops, by opcode, from an ahead-of-time sm90 compile
(no GPU: the static gate's compile, codegen.static.compile_asm, and Triton's cuobjdump). What a page-loop change costs or saves
in issued instructions, before any GPU time:

  python benchmarks/probes/sass_loops.py decode scalar tp1 '{"block_n": 64, "num_warps": 2, "num_stages": 3, "kv_upcast": 3, "kv_tma": 0}'

A loop is a backward branch's range; nested and peeled copies are listed each. Counts are static
(per warp, per iteration), not executed instructions.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from codegen.configs import LaunchConfig  # noqa: E402
from codegen.shapes import HEAD_LAYOUTS  # noqa: E402

_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def _opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def loops(text: str, skip_branches: bool = False) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, opcode counts) of every backward branch's range. skip_branches: leave out the
    instructions a forward branch inside the range jumps over (the path on which every such
    branch is taken: in the prefill walk, a slice that every row sees whole)."""
    instrs = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, text.splitlines()) if m]
    found = []
    for addr, ins in instrs:
        branch = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if branch and int(branch.group(1), 16) < addr:
            start = int(branch.group(1), 16)
            skipped = []
            if skip_branches:
                for a, i in instrs:
                    jump = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", i)
                    if start <= a < addr and jump and a < int(jump.group(1), 16) <= addr:
                        skipped.append((a, int(jump.group(1), 16)))
            ops = collections.Counter(_opcode(i) for a, i in instrs
                                      if start <= a <= addr and not any(lo < a < hi for lo, hi in skipped))
            found.append((start, addr, ops))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", choices=["decode", "prefill"])
    parser.add_argument("scale_mode", choices=["none", "scalar", "per_token_head"])
    parser.add_argument("layout", choices=sorted(HEAD_LAYOUTS))
    parser.add_argument("config", help="LaunchConfig fields as JSON")
    parser.add_argument("--kv-dtype", default=None, help="default: fp8, bf16 for scale mode none")
    parser.add_argument("--top", type=int, default=12, help="opcodes shown per loop")
    parser.add_argument("--skip-branches", action="store_true",
                        help="count the path on which every forward branch inside a loop is taken")
    args = parser.parse_args(argv)
    from codegen.static.compile import compile_asm, cuobjdump
    from codegen.static.launch import launches_for

    config = LaunchConfig.from_dict(json.loads(args.config), what="config")
    kv_dtype = args.kv_dtype or ("bf16" if args.scale_mode == "none" else "fp8")
    hq, hkv = HEAD_LAYOUTS[args.layout]
    launch = launches_for("sm90", args.kernel, args.scale_mode, kv_dtype, hq, hkv, config)[0]
    for start, end, ops in loops(cuobjdump(compile_asm(launch, "cubin"), "-sass"), args.skip_branches):
        full = sum(ops.values())
        shown = ", ".join(f"{op} {n}" for op, n in ops.most_common(args.top))
        print(f"loop {start:#06x}-{end:#06x}: {full:5d} instructions  ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
