"""The prefill's V conversions of kv_upcast 3 that take an operand per key (`_e4m3_to_fp16_keep`'s
mask, `_e4m3_to_fp16_scaled`'s mask and scale) read it once for the four fp8 values packed into one
32-bit word: right only where those four are neighbours of one key in a thread's registers.

Issue 35: over a cache whose rows Triton cannot see 16-byte aligned (a [pages, Hkv, 128, 2D + 8]
buffer's [..., :2D] view), plain loads fetch one byte a thread, a thread's next values belong to the
next keys, and per_token_head scaled three keys of four by the fourth's scale (rel L2 0.15-0.9 on an
H200). The launch now runs those conversions only on aligned rows (`kv_rows_aligned`); these gates
check, ahead of time, that every shipped kv_upcast 3 prefill config keeps a key's values together on
the paths it runs them (TMA boxes, aligned plain loads), and show the layout that broke."""
import dataclasses
import re

import pytest

from codegen import static
from codegen.static.shipped import shipped_launches

# An asm conversion with a per-key operand: it ANDs the fp8 word ($2) with the key's mask ($3).
_PER_KEY_ASM = re.compile(r'tt\.elementwise_inline_asm "[^"]*and\.b32 w, \$2, \$3[^"]*".* : (tensor<[^>]*>)')
_V_CVT_ASM = re.compile(r'tt\.elementwise_inline_asm "[^"]*cvt\.rn\.f16x2\.e4m3x2')


def _layout_definition(ttgir: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)} = (#ttg\.\w+<.*>)$", ttgir, re.MULTILINE)
    assert match, f"layout {name} not defined in the TTGIR"
    return match.group(1)


def _ints(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"-?\d+", text)]


def run_along_dims(layout: str) -> int:
    """How many consecutive registers of a thread hold consecutive values of one key (the last,
    head_dim axis) in a 2-D TTGIR layout: a blocked layout's sizePerThread when that axis is
    fastest; a linear layout's leading register bases [0, 1], [0, 2], [0, 4], ..."""
    if layout.startswith("#ttg.blocked"):
        size = _ints(re.search(r"sizePerThread = \[([^\]]*)\]", layout).group(1))
        order = _ints(re.search(r"order = \[([^\]]*)\]", layout).group(1))
        return size[-1] if order[0] == len(size) - 1 else 1
    if layout.startswith("#ttg.linear"):
        bases = re.search(r"register = \[(.*?)\]\]", layout).group(1)
        run = 1
        for base in re.findall(r"\[(-?\d+), (-?\d+)", bases):
            if tuple(map(int, base)) != (0, run):
                break
            run *= 2
        return run
    raise AssertionError(f"unknown layout kind: {layout[:60]}")


def per_key_runs(ttgir: str) -> list[int]:
    """run_along_dims of the fp8 operand of every per-key asm conversion in `ttgir`."""
    runs = []
    for operand in _PER_KEY_ASM.findall(ttgir):
        name = re.search(r", (#\w+)>$", operand).group(1)
        runs.append(run_along_dims(_layout_definition(ttgir, name)))
    return runs


def test_run_along_dims_reads_both_layout_kinds():
    blocked = "#ttg.blocked<{sizePerThread = [1, 16], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>"
    rows = "#ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [1, 32], warpsPerCTA = [1, 4], order = [1, 0]}>"
    transposed = "#ttg.blocked<{sizePerThread = [4, 1], threadsPerWarp = [8, 4], warpsPerCTA = [4, 1], order = [0, 1]}>"
    linear = ("#ttg.linear<{register = [[0, 1], [0, 2], [0, 16], [32, 0]], lane = [[0, 4], [1, 0]], "
              "warp = [[8, 0]], block = []}>")
    assert [run_along_dims(x) for x in (blocked, rows, transposed, linear)] == [16, 1, 1, 4]


def _kv_upcast_3_prefills():
    return [launch for launch in shipped_launches()
            if launch.arch == "sm90" and launch.kernel == "prefill" and launch.config.kv_upcast == 3]


_LAUNCHES = _kv_upcast_3_prefills()


def _id(launch) -> str:
    c = launch.config
    return (f"{launch.scale_mode}-{launch.num_q_heads}x{launch.num_kv_heads}-bt{c.block_t}-bn{c.block_n}"
            f"-w{c.num_warps}-s{c.num_stages}")


def test_the_shipped_tables_have_kv_upcast_3_prefills():
    assert len(_LAUNCHES) >= 4, "the gate below would check nothing"


@pytest.mark.parametrize("kv_tma", [1, 0], ids=["tma", "aligned_plain_loads"])
@pytest.mark.parametrize("launch", _LAUNCHES, ids=_id)
def test_per_key_conversions_see_one_key_per_word(launch, kv_tma):
    launch = dataclasses.replace(launch, config=dataclasses.replace(launch.config, kv_tma=kv_tma))
    runs = per_key_runs(static.compile_asm(launch, "ttgir"))
    assert runs, "no per-key V conversion in a kv_upcast 3 prefill"
    assert all(run % 4 == 0 for run in runs), (
        f"a thread's packed fp8 word spans keys (runs along head_dim {runs}): the per-key mask/scale "
        "would apply to other keys' values")


def test_unaligned_rows_take_the_exact_conversion():
    """The launch's constexprs for an unaligned cache turn the asm off (kv_upcast 3 runs as 2)."""
    for launch in _LAUNCHES:
        kw = dict(num_q_heads=launch.num_q_heads, num_kv_heads=launch.num_kv_heads, head_dim=launch.head_dim,
                  topk=launch.topk, config=launch.config, kv_tma=False)
        module = launch.module()
        assert module.constexprs(**kw)["V_CVT_ASM"] is True
        assert module.constexprs(**kw, kv_rows_aligned=False)["V_CVT_ASM"] is False
    unaligned = dataclasses.replace(_LAUNCHES[0], kv_rows_aligned=False)
    assert not _V_CVT_ASM.search(static.compile_asm(unaligned, "ttgir"))


def test_unaligned_rows_pack_four_keys_into_a_word(monkeypatch):
    """The cause, as compiled: with the asm forced on over unaligned rows, a thread's four packed
    values are four keys' (a run of 1 along head_dim). Should a Triton keep a key's values together
    there too, this fails, and the gate on kv_rows_aligned may be revisited."""
    launch = next(x for x in _LAUNCHES if x.scale_mode == "per_token_head" and x.config.block_t == 1)
    launch = dataclasses.replace(launch, kv_rows_aligned=False, config=dataclasses.replace(launch.config, kv_tma=0))
    module = launch.module()
    constexprs = module.constexprs
    monkeypatch.setattr(module, "constexprs", lambda **kw: constexprs(**{**kw, "kv_rows_aligned": True}))
    runs = per_key_runs(static.compile_asm(launch, "ttgir"))
    assert runs and all(run == 1 for run in runs), runs


def _kv_upcast_3_decodes():
    """Every shipped sm90 decode split with kv_upcast 3, one per scale mode, block_n and warps (the
    layout's inputs), as TMA reads: decode's lean step zeroes V's unseen keys in the conversion only
    there (`keep_tma_only`), plain loads by their load mask."""
    chosen = {}
    for launch in shipped_launches():
        c = launch.config
        if launch.arch == "sm90" and launch.kernel == "decode_split" and c.kv_upcast == 3:
            chosen.setdefault((launch.scale_mode, c.block_n, c.num_warps),
                              dataclasses.replace(launch, config=dataclasses.replace(c, kv_tma=1)))
    return list(chosen.values())


_DECODES = _kv_upcast_3_decodes()


def test_the_shipped_tables_have_kv_upcast_3_decodes():
    assert len(_DECODES) >= 4, "the gate below would check nothing"


@pytest.mark.parametrize("launch", _DECODES, ids=_id)
def test_decode_per_key_conversions_see_one_key_per_word(launch):
    runs = per_key_runs(static.compile_asm(launch, "ttgir"))
    assert runs, "no per-key V conversion in a kv_upcast 3 decode reading by TMA"
    assert all(run % 4 == 0 for run in runs), (
        f"a thread's packed fp8 word spans keys (runs along head_dim {runs}): the mask of one key "
        "would zero or keep other keys' values")
