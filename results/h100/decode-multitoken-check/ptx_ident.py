"""Which trees' 4-token decode kernels are the same compiled code: the PTX (debug lines dropped) of
every shipped sm90 decode_split compile at decode_query_len 4, hashed, in each tree. CPU only, with
.venv-static's Triton 3.6 (the device image's), run from each tree's root:

  cd NEW && python ptx_ident.py list launches.json       # the launches (tests/static's set, non-varlen)
  cd TREE && python ptx_ident.py hash launches.json TREE.json   # for NEW, f2c909b and bd2457d
  python ptx_ident.py compare launches.json NEW.json f2c909b.json bd2457d.json

A tree without StaticLaunch.decode_query_len (before f53d87d) gets the query length through the
integer arguments only, which is how its kernels specialize."""
import collections
import dataclasses
import hashlib
import json
import multiprocessing
import re
import sys

sys.path.insert(0, ".")


def list_launches(out):
    from codegen import static

    launches = [launch for launch in static.shipped_launches()
                if launch.arch == "sm90" and launch.kernel == "decode_split" and not launch.varlen]
    items = [dict(id=launch.id, config=dataclasses.asdict(launch.config),
                  kw={f.name: getattr(launch, f.name) for f in dataclasses.fields(launch)
                      if f.name not in ("config", "also_kv_dtypes", "also_heads")}) for launch in launches]
    json.dump(items, open(out, "w"))


def ptx_hash(item):
    from codegen.configs import LaunchConfig
    from codegen.static import compile as static_compile
    from codegen.static.launch import StaticLaunch

    fields = {f.name for f in dataclasses.fields(StaticLaunch)}
    kw = {k: v for k, v in item["kw"].items() if k in fields}
    kw["config"] = LaunchConfig.from_dict(item["config"], what="config")
    if "decode_query_len" in fields:
        kw["decode_query_len"] = 4
    typical = static_compile._typical_int_args
    static_compile._typical_int_args = lambda launch: {**typical(launch), "decode_query_len": 4}
    ptx = static_compile.compile_asm(StaticLaunch(**kw), "ptx")
    ptx = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//)", line))
    ptx = ptx.split(".section\t.debug")[0]
    return item["id"], hashlib.sha256(ptx.encode()).hexdigest()[:16]


def compare(launches, new, *others):
    items = json.load(open(launches))
    hashes = [json.load(open(path)) for path in (new, *others)]
    counts = collections.Counter()
    for item in items:
        config = item["config"]
        key = (f"kv_upcast {'3' if config['kv_upcast'] == 3 else '0-2'}, kv_tma {config['kv_tma']}",
               tuple(hashes[0][item["id"]] == other[item["id"]] for other in hashes[1:]))
        counts[key] += 1
    for (group, same), n in sorted(counts.items()):
        print(f"{group}: {n} compiles; same PTX as " + ", ".join(f"{path}: {s}" for path, s in zip(others, same)))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "list":
        list_launches(sys.argv[2])
    elif command == "hash":
        with multiprocessing.Pool(2) as pool:
            json.dump(dict(pool.map(ptx_hash, json.load(open(sys.argv[2])))), open(sys.argv[3], "w"), indent=1)
    elif command == "compare":
        compare(*sys.argv[2:])
    else:
        sys.exit(f"ptx_ident.py: expected list, hash or compare, got {command!r}")
