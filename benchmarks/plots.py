"""PNG plots of a bench.json: per-call time and % of the floor per case, one bar per column.
A kernel with more cases than fit as bars (the full grid) gets grid plots instead: one panel per
head layout and decode context / prefill pattern, time and % of floor over the batch or shape.

  python benchmarks/plots.py OUT_DIR BENCH_JSON [BENCH_JSON ...]
"""
from __future__ import annotations

import pathlib
import sys

BARS_UP_TO = 24  # cases per kernel drawn as bars; more are drawn as grid panels


def token_count(n: int) -> str:
    """A token count as labels show it: whole multiples of 1024 as "8k" (and 0 as "0k"), others in
    full ("64", "1536")."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def ceiling_key(kernel: str) -> str:
    """The row field with the share of the kernel's ceiling: the HBM floor for decode (bytes),
    the measured bf16 matmul peak for prefill (FLOPs)."""
    return "hbm_fraction" if kernel == "decode" else "bf16_fraction"


def write_plots(rows: list[dict], out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    cases = list(dict.fromkeys(r["case"] for r in ok))
    columns = list(dict.fromkeys(r["config"] for r in ok))
    written = []
    for kernel in ("decode", "prefill"):
        names = [c for c in cases if c.startswith(kernel)]
        if not names:
            continue
        if len(names) > BARS_UP_TO:
            written += _grid_plots(plt, [r for r in ok if r["case"] in names], kernel, out)
            continue
        floor_key = ceiling_key(kernel)
        floor_name = "% of HBM floor (copy bandwidth)" if kernel == "decode" else "% of bf16 matmul peak"
        fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.7 * len(names) * len(columns)), 9), sharex=True)
        width = 0.8 / max(len(columns), 1)
        for j, col in enumerate(columns):
            by_case = {r["case"]: r for r in ok if r["config"] == col}
            xs = [i + j * width for i, n in enumerate(names) if n in by_case]
            axes[0].bar(xs, [by_case[n]["time_us"] for n in names if n in by_case], width, label=col)
            axes[1].bar(xs, [100 * by_case[n][floor_key] for n in names if n in by_case], width, label=col)
        axes[0].set_ylabel("us per call (log)")
        axes[0].set_yscale("log")
        axes[1].set_ylabel(floor_name)
        axes[0].legend()
        axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
        axes[1].set_xticklabels([n.removeprefix(kernel + " ") for n in names], rotation=35, ha="right", fontsize=8)
        written.append(_save(plt, fig, out / f"{kernel}.png",
                             f"MSA {kernel}: per-call time from CUDA-graph replays, and fraction of the floor"))
    return written


def _save(plt, fig, path: pathlib.Path, title: str) -> pathlib.Path:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _grid_plots(plt, rows: list[dict], kernel: str, out: pathlib.Path) -> list[pathlib.Path]:
    """Decode: panels per layout x (context, query length), x = requests. Prefill: panels per
    layout x pattern, x = chunk shape. One line per (scale mode, column)."""
    specs = [r["spec"] for r in rows]
    layouts = sorted({s["layout"] for s in specs}, key=lambda l: int(l[2:]))
    if kernel == "decode":
        panels = sorted({(s["context"], s["tokens"]) for s in specs})
        panel_of = lambda s: (s["context"], s["tokens"])  # noqa: E731
        panel_name = lambda p: f"ctx {p[0] // 1024}k, q{p[1]}"  # noqa: E731
        xs = sorted({s["batch"] for s in specs})
        x_of, x_name = (lambda s: s["batch"]), "requests"
    else:
        panels = sorted({s["pattern"] for s in specs})
        panel_of, panel_name = (lambda s: s["pattern"]), str
        xs = sorted({(s["batch"], s["tokens"], s["context"]) for s in specs}, key=lambda x: (x[2], x[0] * x[1], x[0]))
        x_of, x_name = (lambda s: (s["batch"], s["tokens"], s["context"])), "chunk"
    floor_key, floor_name = ceiling_key(kernel), ("% of HBM floor" if kernel == "decode" else "% of bf16 peak")
    columns = list(dict.fromkeys(r["config"] for r in rows))
    modes = list(dict.fromkeys(s["mode"] for s in specs))
    written = []
    for metric, label, scale in (("time_us", "us per call", "log"), (floor_key, floor_name, "linear")):
        fig, axes = plt.subplots(len(layouts), len(panels), squeeze=False, sharex=True,
                                 figsize=(4.2 * len(panels), 3.2 * len(layouts)))
        for i, layout in enumerate(layouts):
            for j, panel in enumerate(panels):
                ax = axes[i][j]
                for mode in modes:
                    for k, col in enumerate(columns):
                        pts = {x_of(r["spec"]): r[metric] * (100 if metric != "time_us" else 1) for r in rows
                               if r["spec"]["layout"] == layout and panel_of(r["spec"]) == panel
                               and r["spec"]["mode"] == mode and r["config"] == col}
                        if pts:
                            ax.plot([xs.index(x) for x in xs if x in pts], [pts[x] for x in xs if x in pts],
                                    marker="o", linestyle=("-", "--", ":", "-.")[k % 4], label=f"{mode} {col}")
                ax.set_yscale(scale)
                ax.set_title(f"{layout}, {panel_name(panel)}", fontsize=9)
                if j == 0:
                    ax.set_ylabel(label)
                ax.set_xticks(range(len(xs)))
                ax.set_xticklabels([str(x) if kernel == "decode" else f"{x[0]}x{token_count(x[1])}+{token_count(x[2])}"
                                    for x in xs], rotation=35, fontsize=7)
                if i == len(layouts) - 1:
                    ax.set_xlabel(x_name)
        axes[0][0].legend(fontsize=6)
        written.append(_save(plt, fig, out / f"{kernel}_{'time' if metric == 'time_us' else 'floor'}.png",
                             f"MSA {kernel}, full grid: {label} (CUDA-graph replays, 20 calls per graph)"))
    return written


def main(argv=None) -> int:
    from script_cli import Parser, read_json

    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=pathlib.Path, help="folder for the PNGs (created)")
    parser.add_argument("bench_json", nargs="+", help="bench.json files written by benchmarks/bench.py --out")
    args = parser.parse_args(argv)
    rows = [r for path in args.bench_json for r in read_json(parser, path, keys=("rows",))["rows"]]
    try:  # before the folder is made: a run that cannot plot leaves nothing behind
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"{parser.prog}: needs matplotlib (pip install matplotlib; only the plots use it, "
              "so no requirements file pins it)", file=sys.stderr)
        return 1
    if args.out_dir.exists() and not args.out_dir.is_dir():
        parser.refuse(f"{args.out_dir}: not a folder")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for written_path in write_plots(rows, args.out_dir):
        print(written_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
