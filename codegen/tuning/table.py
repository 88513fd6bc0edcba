"""`msa-tune table [FILE ...]`: a tuned-config file as a markdown table (the README's tuning table).

One row per bucket and launch path (a prefill bucket's per-token sub-entry is a second row,
`table@tokens:per_token`): default and tuned time from the confirmation run (or the search when
the default won), speedup, trials, failed trials, and the fields where the chosen config differs
from the arch default. Reads only the JSON (no study database, no GPU).
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys

from ..configs import LaunchConfig
from ..tuned_store import PER_TOKEN, REPO_CONFIG_DIR, validate_document
from .argparsing import Parser


def _changed(config: dict) -> str:
    diff = LaunchConfig.from_dict(config).non_default()
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "(arch default)"


def rows(doc: dict) -> list[dict]:
    out = []
    for key, table in sorted(doc["tables"].items()):
        for tokens, entry in sorted(table["buckets"].items(), key=lambda kv: int(kv[0])):
            if "config" in entry:
                out.append(_row(f"{key}@{tokens}", entry))
            if PER_TOKEN in entry:
                out.append(_row(f"{key}@{tokens}:per_token", entry[PER_TOKEN]))
    return out


def _row(bucket: str, entry: dict) -> dict:
    """One launch path's entry as a table row."""
    d, t = entry.get("default_us"), entry.get("tuned_us")
    return dict(bucket=bucket, default_us=d, tuned_us=t, speedup=(d / t) if d and t else None,
                trials=entry.get("trials", 0), failures=entry.get("failures", 0),
                config="default" if entry.get("is_default") else _changed(entry["config"]))


def markdown(doc: dict) -> str:
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = ["| bucket | default us | tuned us | speedup | trials | failed | config |",
             "|---|---:|---:|---:|---:|---:|---|"]
    table = rows(doc)
    for r in table:
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['bucket']} | {fmt(r['default_us'])} | {fmt(r['tuned_us'])} | {speed} | {r['trials']} "
                     f"| {r['failures']} | {r['config']} |")
    speedups = [r["speedup"] for r in table if r["speedup"]]
    if speedups:
        lines.append(f"\n{len(table)} rows; speedup over the arch default: median {statistics.median(speedups):.2f}x, "
                     f"max {max(speedups):.2f}x; {sum(r['config'] != 'default' for r in table)} rows keep a tuned "
                     "config.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = Parser(prog="msa-tune table", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=pathlib.Path, metavar="FILE",
                   help="tuned-config JSON files (default: every measured file in tuned_configs/)")
    args, code = p.parse_or_exit_code(argv)
    if args is None:
        return code
    files = args.files or sorted(REPO_CONFIG_DIR.glob("*.json"))
    docs = []
    for path in files:  # every file read before the first line is printed
        try:
            doc = json.loads(path.read_text())
            validate_document(doc)
        except OSError as exc:
            print(f"msa-tune: FILE: cannot read {path} ({exc.strerror})", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"msa-tune: FILE: {path} is not a tuned-config file ({exc})", file=sys.stderr)
            return 2
        docs.append((path, doc))
    for path, doc in docs:
        if not args.files and not any(t["provenance"].get("measured") for t in doc["tables"].values()):
            continue
        prov = next(iter(doc["tables"].values()))["provenance"]
        print(f"### {path.name}: {prov['gpu_name']}, triton {prov['triton']}, torch {prov['torch']}\n")
        print(markdown(doc))
    return 0
