"""What bounds the Gluon prefill tile? Edited copies of the generated modules (H200).

Each variant edits codegen/generated/sm90_prefill_ws_<mode>.py and times the whole tiled call (plan launch
+ Gluon kernel), graph-timed over 3 rotating seeds of the bench's correlated prefill, beside the module as
it is (whose relative L2 against the float32 reference is checked, output poisoned, every seed). The
variants take work out (timing only: their results are wrong):
  no_convert     the converter waits and signals, but converts nothing
  no_softmax     P = S: no exp2 (max, sums and the rescale stay)
  mma_only       no_convert and no_softmax together
Answered (results/h200/prefill-ws-bounds, prefill-ws-pingpong): 8 converter warps (x0.98), no proxy fence
(x1.00), the conversion layout (8 elements a thread, 4 x 8 threads: shipped), Q as the QK wgmma's register
operand (x1.00), 1 of 2 or 1 of 4 exp2s by polynomial on the FMA pipe (x0.97 / x1.00).

  python benchmarks/probes/ws_limits.py [--modes scalar,per_token_head] [--variants A,B] [--out DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))

import torch  # noqa: E402

from ws_plan import _as_call, _recorded, rel_l2, write_rows  # noqa: E402  (a module's launches, recorded and run)

GENERATED = ROOT / "codegen" / "generated"
NO_CONVERT = [("        dst.slice(c * CR, CR).store(y)\n", "")]
EXP2 = "p = gl.exp2(qk * s_scale - m_shift[:, None])"
NO_SOFTMAX = [(EXP2, "p = qk")]
VARIANTS = {"as is": [], "no_convert": NO_CONVERT, "no_softmax": NO_SOFTMAX, "mma_only": NO_CONVERT + NO_SOFTMAX}
RIGHT = {"as is"}  # the others: timing only
CASES = (("tp1", 4, 2048), ("tp4", 1, 8192))


def edited(name: str, edits, folder: pathlib.Path, source: pathlib.Path):
    """The module at `source` with `edits` applied (each must match), imported under its own name."""
    text = source.read_text()
    for old, new in edits:
        assert old in text, f"{name}: {old!r} not in {source.name}"
        text = text.replace(old, new)
    path = folder / f"{source.stem}_{name.replace(' ', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @gluon.jit looks its globals up through the module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import bench
    from codegen.configs import ws_config
    from codegen.reference import reference_batched
    from codegen.timing import graph_time

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="scalar,per_token_head")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: all)")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rows = []
    folder = pathlib.Path(tempfile.mkdtemp())
    for mode in args.modes.split(","):
        source = GENERATED / f"sm90_prefill_ws_{mode}.py"
        modules = {name: edited(name, VARIANTS[name], folder, source) for name in args.variants.split(",")}
        for layout, batch, tokens in CASES:
            hq, hkv = bench.LAYOUTS[layout]
            config = ws_config(gqa=hq // hkv, convert_rows=32)
            spec = bench.Spec("prefill", layout, mode, batch, tokens, 0, "correlated")
            sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
            refs = [reference_batched(c.kernel, c.args) for c in sets]
            for name, module in modules.items():
                row = dict(case=f"{layout} {batch}x{tokens // 1024}k correlated", mode=mode, variant=name)
                try:
                    if name in RIGHT:
                        row["rel_l2"] = max(rel_l2(module, c, config, r) for c, r in zip(sets, refs))
                    calls = [_as_call(_recorded(module.launch, case, config)) for case in sets]
                    row["us"] = round(graph_time(calls * 4, replays=10).median_us, 1)
                except Exception as exc:  # a variant that does not compile is a row, not the end of the probe
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                print(row, flush=True)
            del sets, refs
            torch.cuda.empty_cache()
    write_rows(args.out, "ws_limits", rows)


if __name__ == "__main__":
    main()
