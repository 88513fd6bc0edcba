"""The Gluon prefill tile compiles for sm90 with the Triton this suite runs (CI's, newer than the H200's
3.6, with which tests/static compiles it). Gluon's names moved between versions (thread_barrier,
async_copy_global_to_shared, _reinterpret); the generated modules pick the one each Triton has.

In a subprocess without TRITON_INTERPRET: under the interpreter, triton.language's own @jit helpers
(the combine functions of gl.max) become interpreted functions a Gluon compile cannot call."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from codegen.generated import sm90_prefill_ws_scalar  # noqa: E402

FIRST_NAMED_BARRIER = min(sm90_prefill_ws_scalar.NAMED_BARRIERS)

SCRIPT = """
import json
import re
from codegen.configs import ws_config
from codegen.static.compile import compile_asm
from codegen.static.launch import launches_for

figures = {}
for mode in ("scalar", "per_token_head"):
    for hq, hkv in ((64, 4), (8, 1)):
        (launch,) = launches_for("sm90", "prefill", mode, "fp8", hq, hkv, ws_config(gqa=hq // hkv, convert_rows=16))
        ptx = compile_asm(launch, "ptx")
        figures[f"{launch.kernel} {mode} {hq}/{hkv}"] = dict(
            wgmma=ptx.count("wgmma.mma_async"), tma=ptx.count("cp.async.bulk.tensor.4d"),
            setmaxnreg=ptx.count("setmaxnreg"),
            # ids of the barriers Triton itself emits (a literal id); the tile's named barriers take a register
            triton_barrier_ids=sorted({int(i) for i in re.findall(r"\\b(?:bar|barrier)\\.(?:sync|arrive)(?:\\.aligned)?\\s+(\\d+)", ptx)}))
print(json.dumps(figures))
"""


def test_the_gluon_tile_compiles_on_this_triton():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(figures) == ["prefill_ws per_token_head 64/4", "prefill_ws per_token_head 8/1",
                               "prefill_ws scalar 64/4", "prefill_ws scalar 8/1"]
    for name, found in figures.items():
        # QK and PV of the two warpgroups of 64 rows, 128 keys a step, 8 wgmma each (as with triton 3.6):
        # in the loop QK and the step before's PV, after it the last step's PV; the K and V pages by 4-D
        # TMA (issued ahead and in the loop); the converter's register split by setmaxnreg; Triton's own
        # barrier ids below the tile's named barriers (a shared id would deadlock).
        assert found["wgmma"] == 24, (name, found)
        assert max(found["triton_barrier_ids"]) < FIRST_NAMED_BARRIER, (name, found)
        assert found["tma"] >= 2 and found["setmaxnreg"] >= 2, (name, found)
