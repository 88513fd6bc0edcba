"""What bounds the Gluon prefill tile, and what shortens it? Edited copies of the generated modules (H200).

Each variant edits codegen/generated/sm90_prefill_ws_<mode>.py and times the whole tiled call (plan launch
+ Gluon kernel), graph-timed over 3 rotating seeds of the bench's correlated prefill, beside the module as
it is. Bounds (timing only: their results are wrong):
  no_convert     the converter waits, fences and signals, but converts nothing
  no_softmax     P = S: no exp2 (max, sums and the rescale stay)
  mma_only       no_convert and no_softmax together
  no_sync        no barrier across the MMA warps before their arrives (the two warpgroups leave lockstep)
Candidates (right: relative L2 against the float32 reference, output poisoned, every seed):
  q_regs         Q as the QK wgmma's register operand (no Q reads from shared memory per step)
  exp_poly2/4    1 of 2 / 1 of 4 exp2s as a degree-3 polynomial on the FMA pipe instead of MUFU
  q_regs+...     both
Answered earlier (results/h200/prefill-ws-bounds): 8 converter warps (x0.98), no proxy fence (x1.00), the
conversion layout (8 elements a thread, 4 x 8 threads: shipped).

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
# Q as wgmma's register operand: loaded from its shared tile once, the QK wgmmas read no Q from shared memory.
Q_REGS = [("    acc = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, o_layout))\n",
           "    acc = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, o_layout))\n"
           "    q_r = q_s.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))\n"),
          ("qk = warpgroup_mma(q_s, k16", "qk = warpgroup_mma(q_r, k16")]

# exp2 off the MUFU unit for part of the scores: 2^x = 2^round(x) * poly(x - round(x)), a degree-3 fit of 2^f
# on [-0.5, 0.5] (7.5e-5 relative) on the FMA pipe; round(x) from the 1.5 * 2^23 trick, its bits shifted
# into the exponent; x clamped at -126 so that the exponent field stays >= 0.
_POLY = ("max.ftz.f32 x, {i}, 0fC2FC0000; add.rn.f32 t, x, 0f4B400000; sub.rn.f32 j, t, 0f4B400000; "
         "sub.rn.f32 f, x, j; fma.rn.f32 p, f, 0f3D61FB83, 0f3E786F02; fma.rn.f32 p, p, f, 0f3F31798D; "
         "fma.rn.f32 p, p, f, 0f3F7FFB49; mov.b32 e, t; shl.b32 e, e, 23; mov.b32 b, p; add.s32 b, b, e; "
         "mov.b32 {o}, b;")


def _poly_asm(n: int) -> str:
    """PTX for n consecutive scores of a thread: the last by the polynomial, the others by ex2.approx."""
    body = " ".join(f"ex2.approx.ftz.f32 ${k}, ${n + k};" for k in range(n - 1))
    return "{ .reg .f32 x, t, j, f, p; .reg .b32 e, b; " + body + " " + _POLY.format(i=f"${2 * n - 1}", o=f"${n - 1}") + " }"


def _exp2_by(asm: str, pack: int):
    helper = (f"@gluon.jit\ndef _exp2_variant(x):\n    return gl.inline_asm_elementwise(\"{asm}\", "
              f"\"{','.join(['=f'] * pack + ['f'] * pack)}\", [x], dtype=gl.float32, is_pure=True, pack={pack})\n\n\n")
    return [("@gluon.jit\ndef _consumer(", helper + "@gluon.jit\ndef _consumer("),
            (EXP2, "p = _exp2_variant(qk * s_scale - m_shift[:, None])")]


EXP_POLY2, EXP_POLY4 = _exp2_by(_poly_asm(2), 2), _exp2_by(_poly_asm(4), 4)
# The MMA warps' lockstep: no partition-wide barrier before they arrive kempty / vempty (timing only: a
# stage may be overwritten while the other warpgroup still reads it)
NO_SYNC = [("        _cta_barrier()  # both warpgroups' wgmmas retired", "        # both warpgroups' wgmmas retired")]
VARIANTS = {"as is": [], "no_convert": NO_CONVERT, "no_softmax": NO_SOFTMAX, "mma_only": NO_CONVERT + NO_SOFTMAX,
            "no_sync": NO_SYNC, "q_regs": Q_REGS, "exp_poly2": EXP_POLY2, "exp_poly4": EXP_POLY4,
            "q_regs+exp_poly2": Q_REGS + EXP_POLY2, "q_regs+exp_poly4": Q_REGS + EXP_POLY4}
RIGHT = {"as is", "q_regs", "exp_poly2", "exp_poly4", "q_regs+exp_poly2", "q_regs+exp_poly4"}  # the others: timing only
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
        modules = {name: edited(name, VARIANTS[name], folder, source, strict=False)
                   for name in args.variants.split(",")}
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
