"""What makes the Gluon tile slower with per_token_head scales than with scalar ones? (H200)

Times edited copies of codegen/generated/sm90_prefill_ws_per_token_head.py, each with one part of the
per-token work taken out (timing only: their results are wrong), beside the module as shipped and the
scalar module, on the bench's correlated 8k prefill (TP1 and TP4; plan launch included, selection
'tiled', graph-timed over 3 seeds):
  maxima    the converter's two cross-warp maxima of a page's scales replaced by 1
  scaling   that, and the per-row scale loads and multiplies of the conversion replaced by 1
  rescale   the MMA warps' accumulator rescale by the pages' largest V scales left out

  python benchmarks/probes/ws_pth.py [--out DIR]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))

import torch  # noqa: E402

from ws_limits import edited  # noqa: E402  (a generated module with text edits, imported)
from ws_plan import _as_call, _recorded, write_rows  # noqa: E402  (a module's launches, recorded and run)

PTH = ROOT / "codegen" / "generated" / "sm90_prefill_ws_per_token_head.py"
MAXIMA = [("k_top = _slice_top(ks_row, stride_ks_t, n_vis, BN, top_layout)", "k_top = gl.to_tensor(1.0)"),
          ("v_top = _slice_top(vs_row, stride_vs_t, n_vis, BN, top_layout)", "v_top = gl.to_tensor(1.0)")]
SCALING = MAXIMA + [("sc = gl.load(scale_row + rows * stride_sc_t, mask=rows < n_vis, other=0.0)",
                     "sc = gl.full([CR], 1.0, gl.float32, gl.SliceLayout(1, cvt_layout))")]
RESCALE = [("        alpha = alpha * (acc_unit / v_top)\n        acc_unit = v_top\n", "")]
VARIANTS = {"shipped": [], "maxima": MAXIMA, "scaling": SCALING, "rescale": RESCALE}


def main() -> None:
    import bench
    from codegen.configs import ws_config
    from codegen.generated import sm90_prefill_ws_scalar as scalar
    from codegen.timing import graph_time

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    rows = []
    folder = pathlib.Path(tempfile.mkdtemp())
    modules = {name: edited(name, edits, folder, PTH) for name, edits in VARIANTS.items()}
    for layout in ("tp1", "tp4"):
        hq, hkv = bench.LAYOUTS[layout]
        config = ws_config(gqa=hq // hkv, convert_rows=16)
        for mode, runs in (("scalar", {"scalar module": scalar}), ("per_token_head", modules)):
            spec = bench.Spec("prefill", layout, mode, 1, 8192, 0, "correlated")
            sets = [bench.build(spec, "sm90", seed) for seed in range(3)]
            for name, module in runs.items():
                calls = [_as_call(_recorded(module.launch, case, config)) for case in sets]
                t = graph_time(calls * 4, replays=10)
                rows.append(dict(case=f"{layout} 1x8k correlated", mode=mode, variant=name, us=round(t.median_us, 1)))
                print(rows[-1], flush=True)
            del sets
            torch.cuda.empty_cache()
    write_rows(args.out, "ws_pth", rows)


if __name__ == "__main__":
    main()
