"""PNG plots of a bench.json: per-call time and % of the floor per case, one bar per column."""
from __future__ import annotations

import pathlib


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
        floor_key = "hbm_fraction" if kernel == "decode" else "bf16_fraction"
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
        fig.suptitle(f"MSA {kernel}: per-call time from CUDA-graph replays, and fraction of the floor")
        fig.tight_layout()
        path = out / f"{kernel}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
