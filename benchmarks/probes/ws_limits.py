"""What bounds the Gluon prefill tile? Timing of edited copies of the generated modules (H200).

Each variant takes one part of the work out of codegen/generated/sm90_prefill_ws_<mode>.py (timing only:
its results are wrong, except `conv8`) and times the whole tiled call (plan launch + Gluon kernel),
graph-timed over 3 rotating seeds of the bench's correlated prefill, beside the module as it is:
  conv8          the converter partition at 8 warps and 40 registers (the MMA warps keep 216): right
  no_convert     the converter waits, fences and signals, but converts nothing
  no_softmax     P = S: no exp2 (max, sums and the rescale stay)
  no_fence       no proxy fence after the converter's stores
  mma_only       no_convert and no_softmax together
  cvt_2x16       the conversion's register layout 8 elements a thread, 2 rows x 16 threads a warp: right
  cvt_4x8        8 elements a thread, 4 rows x 8 threads (a row in two passes): right

  python benchmarks/probes/ws_limits.py [--modes scalar,per_token_head] [--out DIR]
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

from ws_plan import _as_call, _recorded, write_rows  # noqa: E402  (a module's launches, recorded and run)

GENERATED = ROOT / "codegen" / "generated"
CONV8 = [("gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])", "gl.BlockedLayout([1, 16], [4, 8], [8, 1], [1, 0])"),
         ("CONVERTER_WARPS = 4\n", "CONVERTER_WARPS = 8\n"), ("CONVERTER_REGS = 56\n", "CONVERTER_REGS = 40\n")]
NO_CONVERT = [("        dst.slice(c * CR, CR).store(y)\n", "")]
NO_SOFTMAX = [("p = gl.exp2(qk * s_scale - m_shift[:, None])", "p = qk"),
              ("p = gl.exp2(qk - m_shift[:, None])", "p = qk")]
NO_FENCE = [("        fence_async_shared()  # generic-proxy stores", "        # generic-proxy stores"),
            ("        fence_async_shared()  # also orders", "        # also orders")]
CVT = "gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])"
CVT_2X16 = [(CVT, "gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])")]
CVT_4X8 = [(CVT, "gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])")]
VARIANTS = {"as is": [], "conv8": CONV8, "no_convert": NO_CONVERT, "no_softmax": NO_SOFTMAX,
            "no_fence": NO_FENCE, "mma_only": NO_CONVERT + NO_SOFTMAX, "cvt_2x16": CVT_2X16, "cvt_4x8": CVT_4X8}
CASES = (("tp1", 4, 2048), ("tp4", 1, 8192))


def edited(name: str, edits, folder: pathlib.Path, source: pathlib.Path, strict: bool = True):
    """The module at `source` with `edits` applied, imported under its own name. strict: every edit must
    match (else an edit that matches nothing is skipped: the two modes' softmax lines differ)."""
    text = source.read_text()
    for old, new in edits:
        assert not strict or old in text, f"{name}: {old!r} not in {source.name}"
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
        modules = {name: edited(name, VARIANTS[name], folder, source, strict=False)
                   for name in args.variants.split(",")}
        for layout, batch, tokens in CASES:
            hq, hkv = bench.LAYOUTS[layout]
            config = ws_config(gqa=hq // hkv, convert_rows=32)
            spec = bench.Spec("prefill", layout, mode, batch, tokens, 0, "correlated")
            sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
            for name, module in modules.items():
                row = dict(case=f"{layout} {batch}x{tokens // 1024}k correlated", mode=mode, variant=name)
                try:
                    calls = [_as_call(_recorded(module.launch, case, config)) for case in sets]
                    row["us"] = round(graph_time(calls * 4, replays=10).median_us, 1)
                except Exception as exc:  # a variant that does not compile is a row, not the end of the probe
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                print(row, flush=True)
            del sets
            torch.cuda.empty_cache()
    write_rows(args.out, "ws_limits", rows)


if __name__ == "__main__":
    main()
