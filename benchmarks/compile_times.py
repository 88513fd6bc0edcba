"""Compile time (ptxas included) of every kernel tests/gpu and the tuned table launch, ahead of time.

Usage: .venv-static/bin/python -m benchmarks.compile_times [--jobs N] [--layouts tp1] [--no-tuned]
       [--json PATH]
Compiles with the static gate (codegen.static: sm90, no GPU), bypassing its figure cache so every
kernel is really compiled, and prints one row per kernel (seconds), the distinct-kernel count, and
the kernels over the compile-time limit (codegen.static.COMPILE_SECONDS_LIMIT).
"""
from __future__ import annotations

import argparse
import json
import sys

from codegen import gpu_suite, static
from codegen.shapes import DEFAULT_MODES, HEAD_LAYOUTS
from codegen.tuned_store import PER_TOKEN, REPO_CONFIG_DIR, parse_table_key, path_entries, read_document

SUITE_MODES = DEFAULT_MODES + (("none", "fp8"),)


def suite_launches(arch: str, layouts) -> list:
    launches = []
    for family, configs in gpu_suite.suite_configs().items():
        for config in configs:
            for mode, kv_dtype in SUITE_MODES:
                if config.kv_upcast and kv_dtype != "fp8":
                    continue
                for layout in layouts:
                    hq, hkv = HEAD_LAYOUTS[layout]
                    launches += static.launches_for(arch, family, mode, kv_dtype, hq, hkv, config, source="gpu-suite")
    return launches


def tuned_launches(arch: str, device: str = "NVIDIA_H200") -> list:
    doc = read_document(REPO_CONFIG_DIR / f"{arch}__{device}.json")
    launches = []
    for key, table in doc["tables"].items():
        family, mode, kv_dtype, hq, hkv = parse_table_key(key)
        for path in ("tiled", PER_TOKEN):  # path_entries: a bucket may hold one path's entry alone
            for entry in path_entries(table, path).values():
                launches += static.launches_for(arch, family, mode, kv_dtype, hq, hkv, entry["config"],
                                                source="tuned")
    return launches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm90")
    parser.add_argument("--layouts", default="tp1", help="comma-separated head layouts of the suite's configs")
    parser.add_argument("--no-tuned", action="store_true", help="leave out the tuned table's configs")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = [x for x in layouts if x not in HEAD_LAYOUTS]
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; expected some of {sorted(HEAD_LAYOUTS)}")
    launches = suite_launches(args.arch, layouts) + ([] if args.no_tuned else tuned_launches(args.arch))
    unique = list({launch.id: launch for launch in launches}.values())
    reports = static.report_many(unique, jobs=args.jobs, use_cache=False)
    rows = sorted(({"kernel": r.launch_id, "source": r.source, "seconds": r.compile_seconds, "error": r.error}
                   for r in reports), key=lambda row: -(row["seconds"] or 0))
    for row in rows:
        print(f"{row['seconds']:>7.2f} s  {row['source']:<9} {row['kernel']}" + (f"  ERROR {row['error']}" if row["error"] else ""))
    total = sum(row["seconds"] or 0 for row in rows)
    slow = [row for row in rows if (row["seconds"] or 0) > static.COMPILE_SECONDS_LIMIT]
    print(f"{len(rows)} distinct kernels, {total:.1f} s of compiles; {len(slow)} over the "
          f"{static.COMPILE_SECONDS_LIMIT:g} s limit")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
