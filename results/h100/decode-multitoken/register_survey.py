"""Registers (and spill bytes) of every shipped decode config, ahead of time for sm90 (Triton of the
interpreter running it: .venv-static's 3.6), at 1 and 4 tokens a request and at 1, 7 and 32 requests.
Run from the root of the tree to survey (this one, or e.g. `git archive bd2457d` unpacked), with this
repository's static tools on the path:

  cd TREE && /path/to/msa-tune/.venv-static/bin/python /path/to/register_survey.py [--tables FILE]

A tree without StaticLaunch.decode_query_len (before f53d87d) gets the query length through the
integer arguments only, which is how its kernels specialize (it has no MASK_ALL_SLICES)."""
import argparse
import dataclasses
import json
import multiprocessing
import sys

sys.path.insert(0, ".")


def registers(item):
    mode, kv_dtype, hq, hkv, config, qlen, num_reqs = item
    from codegen.configs import LaunchConfig
    from codegen.static import compile as static_compile
    from codegen.static.launch import launches_for

    typical = static_compile._typical_int_args
    static_compile._typical_int_args = lambda launch: {**typical(launch), "decode_query_len": qlen,
                                                       "num_reqs": num_reqs}
    launch = launches_for("sm90", "decode", mode, kv_dtype, hq, hkv, LaunchConfig.from_dict(config, what="config"))[0]
    if "decode_query_len" in {f.name for f in dataclasses.fields(launch)}:
        launch = dataclasses.replace(launch, decode_query_len=qlen)
    figures = static_compile.compile_figures(static_compile.compile_inputs(launch))
    return figures.get("registers"), figures.get("spill")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default="tuned_configs/sm90__NVIDIA_H200.json")
    args = parser.parse_args()
    tables = json.load(open(args.tables))["tables"]
    configs = sorted({(key.split("/")[1], key.split("/")[2], *map(int, key.split("/")[3].split("x")),
                       json.dumps(entry["config"], sort_keys=True))
                      for key, table in tables.items() if key.startswith("decode/")
                      for entry in table["buckets"].values() if "config" in entry})
    shapes = ((1, 7), (4, 7), (1, 1), (1, 32))  # (tokens a request, requests)
    items = [(m, k, hq, hkv, json.loads(c), q, n) for m, k, hq, hkv, c in configs for q, n in shapes]
    with multiprocessing.Pool(2) as pool:
        figures = pool.map(registers, items)
    print("mode heads config | registers (spill B) at " + ", ".join(f"{q} tok x {n} req" for q, n in shapes))
    for i, (mode, kv_dtype, hq, hkv, config) in enumerate(configs):
        c = json.loads(config)
        label = "bn{block_n} w{num_warps} st{num_stages} sp{num_splits} up{kv_upcast} tma{kv_tma}".format(**c)
        cells = figures[i * len(shapes):(i + 1) * len(shapes)]
        print(f"{mode} {hq}/{hkv} {label} | " + ", ".join(f"{r} ({s})" for r, s in cells))


if __name__ == "__main__":
    main()
