"""Before/after table (markdown) and plots of bench.json files measured in one run.

  python benchmarks/probes/before_after.py --before b1.json [b2.json ...] --after a1.json [a2.json ...] \
      [--plots DIR]

Rows pair up by case label; each side keeps its own run's ceilings (`hbm_fraction` is the floor's
share of the time, `bf16_fraction` the share of the measured bf16 matmul peak). A decode row reports
% of the HBM floor, a prefill row % of the bf16 peak. Plots (matplotlib, optional): decode, per-call
time and % of the HBM floor against the batch size; prefill, useful TFLOP/s per case, before and
after side by side (one yardstick), one panel per (layout, mode) that has cases.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench.py, plots.py
from plots import ceiling_key  # noqa: E402  (benchmarks/plots.py; matplotlib only when plotting)


def load(paths) -> dict[str, dict]:
    rows = {}
    for path in paths:
        for row in json.loads(pathlib.Path(path).read_text())["rows"]:
            if "error" not in row:
                rows[row["case"]] = row
    return rows


_SHOWN = ("block_t", "block_n", "num_warps", "num_stages", "num_splits", "fused_merge", "kv_upcast")
_OTHER_KERNELS = {"decode": ("block_t",), "prefill": ("num_splits", "fused_merge")}  # fields the kernel ignores


def _label(row: dict) -> str:
    """The launch fields that matter; a Gluon tile (warp_specialize) by its one knob (configs.WS_FIXED)."""
    config = row["launch"]
    if config.get("warp_specialize"):
        return f"Gluon tile, block_t {config['block_t']}, convert_rows {config['convert_rows']}"
    return ", ".join(f"{k} {v}" for k, v in config.items() if k in _SHOWN
                     and k not in _OTHER_KERNELS[row["spec"]["kernel"]])


def share(row: dict) -> float:
    """% of the row's ceiling: the HBM floor for decode, the bf16 matmul peak for prefill."""
    return 100 * row[ceiling_key(row["spec"]["kernel"])]


def markdown(before: dict, after: dict) -> str:
    kernels = {r["spec"]["kernel"] for r in after.values()}
    ceiling = "bf16 peak" if kernels == {"prefill"} else "floor" if kernels == {"decode"} else "floor / bf16 peak"
    lines = [f"| case | before us | after us | before / after | after % of {ceiling} | after rel L2 | after config |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for case, a in after.items():
        b = before.get(case)
        launch = _label(a)
        lines.append(f"| {case} | {b['time_us']:.1f} | {a['time_us']:.1f} | {b['time_us'] / a['time_us']:.2f} | "
                     f"{share(a):.1f} | {a['rel_l2']:.1e} | {launch} |" if b else
                     f"| {case} | - | {a['time_us']:.1f} | - | {share(a):.1f} | {a['rel_l2']:.1e} | {launch} |")
    ratios = [before[c]["time_us"] / a["time_us"] for c, a in after.items() if c in before]
    slower = sum(r < 1 for r in ratios)
    lines += ["", f"{len(ratios)} cases: before / after median {statistics.median(ratios):.2f}, "
              f"min {min(ratios):.2f}, max {max(ratios):.2f}; {slower} slower than before."]
    return "\n".join(lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(before: dict, after: dict, out: pathlib.Path) -> list[pathlib.Path]:
    written = []
    for kernel, draw in (("decode", decode_plots), ("prefill", prefill_plot)):
        rows = {c: r for c, r in after.items() if r["spec"]["kernel"] == kernel}
        if rows:
            written += draw(before, rows, out)
    return written


def prefill_plot(before: dict, after: dict, out: pathlib.Path) -> list[pathlib.Path]:
    """Useful TFLOP/s per prefill case, before and after (one yardstick: each run's own bf16 peak is in its
    table), one panel per (layout, mode) that has cases."""
    plt = _pyplot()
    panels = sorted({(r["spec"]["layout"], r["spec"]["mode"]) for r in after.values()})
    cols = min(3, len(panels))
    rows_of_panels = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_of_panels, cols, squeeze=False, figsize=(4.7 * cols, 3.2 * rows_of_panels))
    tflops = lambda r: r["flops"] / r["time_us"] / 1e6  # noqa: E731
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (layout, mode) in zip(axes.flat, panels):
        rows = sorted((r for r in after.values() if r["spec"]["layout"] == layout and r["spec"]["mode"] == mode),
                      key=lambda r: (r["spec"]["pattern"], r["spec"]["context"], r["spec"]["tokens"]))
        labels = [r["case"].split(f"{mode} ", 1)[-1] for r in rows]
        ys = range(len(rows))
        ax.barh([y + 0.2 for y in ys], [tflops(before[r["case"]]) if r["case"] in before else 0 for r in rows],
                height=0.4, color="0.7", label="before")
        ax.barh([y - 0.2 for y in ys], [tflops(r) for r in rows], height=0.4, color="tab:blue", label="after")
        ax.set_yticks(list(ys), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_title(f"{layout} {mode}", fontsize=9)
        ax.set_xlabel("useful TFLOP/s", fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path = out / "prefill_tflops.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return [path]


def decode_plots(before: dict, after: dict, out: pathlib.Path) -> list[pathlib.Path]:
    plt = _pyplot()
    panels = sorted({(r["spec"]["layout"], r["spec"]["mode"]) for r in after.values()})
    written = []
    for metric, ylabel, name in (("time_us", "us per call", "decode_time.png"),
                                 ("hbm_fraction", "% of the HBM floor", "decode_floor.png")):
        fig, axes = plt.subplots(len({p[0] for p in panels}), len({p[1] for p in panels}), squeeze=False,
                                 figsize=(13, 9), sharex=True)
        layouts = sorted({p[0] for p in panels})
        modes = sorted({p[1] for p in panels})
        for (layout, mode) in panels:
            ax = axes[layouts.index(layout)][modes.index(mode)]
            for side, rows, style in (("before", before, "--"), ("after", after, "-")):
                for qlen in (1, 4):
                    for ctx in (8192, 131072):
                        pts = sorted((r["spec"]["batch"], r[metric]) for r in rows.values()
                                     if r["spec"]["layout"] == layout and r["spec"]["mode"] == mode
                                     and r["spec"]["tokens"] == qlen and r["spec"]["context"] == ctx)
                        if pts:
                            scale = 100 if metric == "hbm_fraction" else 1
                            ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], style, marker=".",
                                    label=f"{side} q{qlen} ctx{ctx // 1024}k")
            ax.set_xscale("log", base=2)
            if metric == "time_us":
                ax.set_yscale("log")
            ax.set_title(f"{layout} {mode}", fontsize=9)
            ax.set_xlabel("requests")
            ax.set_ylabel(ylabel)
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
        written.append(out / name)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--plots", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    before, after = load(args.before), load(args.after)
    print(markdown(before, after))
    if args.plots:
        for path in plots(before, after, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
