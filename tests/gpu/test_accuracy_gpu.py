"""GPU accuracy gates (run on a machine with a GPU; CI has none, so these skip there).

The CPU gates' cases at the model's real sizes (head_dim 128, topk 16, per-rank head layouts) with
bf16 queries on the device, through the module generated for the device's arch.
Run: python -m pytest tests/gpu -q -n 8 (or bash scripts/gpu_check.sh)

Cheap on the host on purpose (issue 25: the suite once took > 5 minutes with the GPU idle): the
references run on the GPU in float64 (cases.run_reference(on_device=True)), and the configs come
from codegen.gpu_suite, so tests share compiled kernels (a cold Triton cache compiles each
(config, specialization) once, 1-3 s with ptxas).
"""

import dataclasses

import pytest
import torch

from codegen import cases, gpu_suite
from codegen.accuracy import compare
from codegen.shapes import SERVING_LAYOUTS
from codegen.tuned_store import REPO_CONFIG_DIR
from codegen.validate import detect_device_arch
from codegen.variants import get_arch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

MODES = [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "fp8"), ("none", "bf16")]
LAYOUTS = SERVING_LAYOUTS


@pytest.fixture(scope="module")
def arch():
    return detect_device_arch(torch.device("cuda"))


def _reference(case):
    """float64 on the GPU: the per-token CPU loop took 1-4 s per test at these sizes."""
    return cases.run_reference(case, dtype=torch.float64, on_device=True)


def _check(case, config, **kw):
    case.poison()
    out = cases.run_kernel(case, config=config, **kw)
    torch.cuda.synchronize()
    result = compare(out, _reference(case), torch.bfloat16)
    assert result.ok, f"{case.kernel} {case.scale_mode}: {result}"
    return out


def _replay_on(graph, case, fresh):
    """Copies fresh's inputs into the buffers `graph` captured from `case`, poisons the output,
    replays, and compares with the reference."""
    case.refill_from(fresh)
    graph.replay()
    torch.cuda.synchronize()
    return compare(case.output, _reference(case), torch.bfloat16)


@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("config", gpu_suite.PREFILL, ids=lambda c: f"bn{c.block_n}-bt{c.block_t}")
def test_prefill_gpu(arch, mode, kv_dtype, layout, config):
    hq, hkv = LAYOUTS[layout]
    case = cases.prefill_case(arch=arch, q_lens=[40, 7, 130], prefix_lens=[3000, 0, 900], num_q_heads=hq,
                              num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode, q_dtype=torch.bfloat16,
                              device="cuda", seed=config.block_n, pattern="correlated" if config.block_t > 1 else "random")
    _check(case, config)


# Single-token requests, 4-token ones with padded rows after them, and varlen rows (one request empty).
DECODE_SHAPES = {
    "uniform_q1": dict(seq_lens=[9000, 130, 2100, 40000]),
    "uniform_q4": dict(seq_lens=[5000, 2100], decode_query_len=4, padded_rows=3),
    "varlen_padded": dict(seq_lens=[3000, 70, 0, 2500], varlen_q_lens=[3, 1, 0, 2], padded_rows=5),
}


def _decode_shape(shape, **kw):
    return cases.decode_case(**DECODE_SHAPES[shape], **kw)


@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("config", gpu_suite.DECODE, ids=lambda c: f"sp{c.num_splits}-fm{c.fused_merge}")
@pytest.mark.parametrize("shape", sorted(DECODE_SHAPES))
def test_decode_gpu(arch, mode, kv_dtype, layout, config, shape):
    hq, hkv = LAYOUTS[layout]
    kw = dict(arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode,
              q_dtype=torch.bfloat16, device="cuda", seed=config.num_splits)
    case = _decode_shape(shape, **kw)
    out = _check(case, config)
    real = case.args["q"].shape[0] - DECODE_SHAPES[shape].get("padded_rows", 0)
    assert torch.equal(out[real:], torch.zeros_like(out[real:]))


@pytest.mark.parametrize("mode,kv_dtype", MODES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kv_tma", [0, 1])
@pytest.mark.parametrize("shape", sorted(DECODE_SHAPES))
def test_decode_v_early_gpu(arch, mode, kv_dtype, layout, kv_tma, shape):
    """v_early 1 (LaunchConfig.v_early): V and per_token_head's column scales loaded beside K, by TMA
    boxes or plain loads, one slice a program and several; fresh random inputs."""
    hq, hkv = LAYOUTS[layout]
    kw = dict(arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode,
              q_dtype=torch.bfloat16, device="cuda", seed=21 + kv_tma)
    case = _decode_shape(shape, **kw)
    for config in gpu_suite.decode_v_early(kv_dtype, get_arch(arch).fp8_cvt_asm):
        _check(case, dataclasses.replace(config, kv_tma=kv_tma))


@pytest.mark.parametrize("config", [gpu_suite.DECODE_UNFUSED, gpu_suite.DECODE_FUSED], ids=["unfused", "fused"])
def test_decode_cuda_graph_replay(arch, config):
    """Captured once (three calls in one graph), replayed on new inputs copied into the same
    buffers, several times: still right (the fused merge's counters return to zero each call)."""
    kw = dict(arch=arch, num_q_heads=16, num_kv_heads=1, q_dtype=torch.bfloat16, device="cuda")
    case = cases.decode_case(seq_lens=[4000, 300, 7000], padded_rows=2, seed=1, **kw)
    cases.run_kernel(case, config=config)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            cases.run_kernel(case, config=config)
    for seed in (2, 3, 4):
        result = _replay_on(graph, case, cases.decode_case(seq_lens=[4000, 300, 7000], padded_rows=2, seed=seed, **kw))
        assert result.ok, f"replay with seed {seed}: {result}"


@pytest.mark.parametrize("mode", ["scalar", "per_token_head", "none"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
@pytest.mark.parametrize("kv_upcast", [1, 2])
def test_kv_upcast_gpu(arch, mode, layout, kernel, kv_upcast):
    """fp8 K/V through fp32, or into fp16 MMAs, at the bf16 gate."""
    hq, hkv = LAYOUTS[layout]
    kw = dict(arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype="fp8", scale_mode=mode, q_dtype=torch.bfloat16,
              device="cuda", seed=7 + kv_upcast)
    if kernel == "prefill":
        case = cases.prefill_case(q_lens=[40, 7, 130], prefix_lens=[3000, 0, 900], pattern="correlated", **kw)
        configs = gpu_suite.prefill_upcast(kv_upcast)
    else:
        case = cases.decode_case(seq_lens=[9000, 130, 2100, 40000], **kw)
        configs = gpu_suite.decode_upcast(kv_upcast)
    for config in configs:
        _check(case, config)


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_unfolded_baseline_gpu(arch, kernel, layout):
    """The seed's unfolded scalar rendering, which the benchmark compares against."""
    hq, hkv = LAYOUTS[layout]
    kw = dict(arch=arch, num_q_heads=hq, num_kv_heads=hkv, q_dtype=torch.bfloat16, device="cuda", seed=3)
    if kernel == "prefill":
        case = cases.prefill_case(q_lens=[40, 130], prefix_lens=[3000, 900], **kw)
    else:
        case = cases.decode_case(seq_lens=[9000, 130, 2100], **kw)
    configs = ((gpu_suite.PREFILL_PER_TOKEN, gpu_suite.PREFILL_TILES) if kernel == "prefill"
               else (gpu_suite.DECODE_ONE_SPLIT, gpu_suite.DECODE_UNFUSED))
    for config in configs:
        _check(case, config, fold_scales=False)


def test_prefill_auto_selection_in_a_cuda_graph(arch):
    """selection='auto' decides on the device: one captured call, replayed on correlated then on
    random selections (same shapes), takes the tiled path, then the per-token one, right both times.
    Both paths compute the same output, so each replay's path is read off the offsets its two launches
    read (the decision launch gives the call's to one, zeros to the other)."""
    from codegen.selection import choose_tiles

    kw = dict(arch=arch, q_lens=[256, 64], prefix_lens=[60000, 3000], num_q_heads=16, num_kv_heads=1,
              q_dtype=torch.bfloat16, device="cuda", future_prob=0.0)
    case = cases.prefill_case(pattern="correlated", seed=1, **kw)
    config = gpu_suite.PREFILL_TILES
    cases.run_kernel(case, config=config, selection="auto")  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with cases.prefill_launch_offsets() as offsets, torch.cuda.graph(graph):  # a capture builds its own launches
        cases.run_kernel(case, config=config, selection="auto")
    assert sorted(offsets) == [1, 4], offsets
    for pattern, tiles in (("correlated", True), ("random", False), ("correlated", True)):
        fresh = cases.prefill_case(pattern=pattern, seed=2, **kw)
        a = fresh.args
        assert bool(choose_tiles(a["topk_idx"], 4, "scalar", a["cu_seqlens_q"], a["prefix_lens"])) is tiles
        result = _replay_on(graph, case, fresh)
        assert result.ok, f"replay on {pattern} selections: {result}"
        cu = case.args["cu_seqlens_q"]
        zeros = torch.zeros_like(cu)
        assert torch.equal(offsets[4], cu if tiles else zeros), f"{pattern}: the tiles got {offsets[4].tolist()}"
        assert torch.equal(offsets[1], zeros if tiles else cu), f"{pattern}: the walk got {offsets[1].tolist()}"


@pytest.mark.parametrize("mode,kv_dtype", [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16")])
@pytest.mark.parametrize("tail", cases.TAILS)
@pytest.mark.parametrize("path", ["prefill_tiles", "prefill_per_token", "decode"])
def test_topk_tails_gpu(arch, mode, kv_dtype, tail, path):
    """vLLM's top-k contract: only a token's first min(16, p // 128 + 1) entries are read, whatever
    follows them (tests/interp/test_topk_contract.py at the model's sizes); junk inside them too."""
    hq, hkv = LAYOUTS["tp4"]
    kw = dict(arch=arch, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode,
              q_dtype=torch.bfloat16, device="cuda", seed=11, tail=tail, inner_junk=0.1 if tail == "mixed" else 0.0)
    if path == "decode":
        case = cases.decode_case(seq_lens=[100, 700, 1900, 9000], decode_query_len=2, padded_rows=2, **kw)
        config = gpu_suite.DECODE_FUSED
    else:
        case = cases.prefill_case(q_lens=[300, 40], prefix_lens=[0, 1800], pattern="correlated", **kw)
        config = gpu_suite.PREFILL_TILES if path == "prefill_tiles" else gpu_suite.PREFILL_PER_TOKEN
    _check(case, config)


@pytest.mark.parametrize("mode,kv_dtype", [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16")])
@pytest.mark.parametrize("config", [gpu_suite.DECODE_ONE_SPLIT, gpu_suite.DECODE_FUSED], ids=["sp1", "fused"])
def test_decode_nan_past_the_sequence_gpu(arch, mode, kv_dtype, config):
    """A TMA box reads whole slices: NaN in the slots past a request's length (fp8 NaN is 0x7f here,
    which the hardware decodes as NaN, unlike the interpreter) must not reach the output."""
    hq, hkv = LAYOUTS["tp1"]
    case = cases.decode_case(arch=arch, seq_lens=[300, 2100, 9000, 61], num_q_heads=hq, num_kv_heads=hkv,
                             kv_dtype=kv_dtype, scale_mode=mode, q_dtype=torch.bfloat16, device="cuda", seed=5)
    expected = _reference(case)
    case.poison_past_the_end()
    case.poison()
    out = cases.run_kernel(case, config=config)
    torch.cuda.synchronize()
    result = compare(out, expected, torch.bfloat16)
    assert result.ok, f"{mode}: {result}"


@pytest.mark.parametrize("mode,kv_dtype", [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16")])
@pytest.mark.parametrize("block_t,block_n,kv_upcast", gpu_suite.PREFILL_NAN)
def test_prefill_nan_past_the_sequence_gpu(arch, mode, kv_dtype, block_t, block_n, kv_upcast):
    """As the decode test: prefill's TMA boxes read the slots past each request's end (NaN here). The
    tiles zero them in V's fp8 -> fp16 conversion (kv_upcast 3) or with a select, only on the slices
    some row sees in part; the per-token walk likewise."""
    hq, hkv = LAYOUTS["tp1"]
    case = cases.prefill_case(arch=arch, q_lens=[300, 77, 130], prefix_lens=[1000, 0, 4000], num_q_heads=hq,
                              num_kv_heads=hkv, kv_dtype=kv_dtype, scale_mode=mode, q_dtype=torch.bfloat16,
                              device="cuda", seed=9, pattern="correlated")
    expected = _reference(case)
    case.poison_past_the_end()
    case.poison()
    config = gpu_suite.prefill_nan_config(block_t, block_n, kv_upcast, kv_dtype)
    out = cases.run_kernel(case, config=config, selection="tiled" if block_t > 1 else "per_token")
    torch.cuda.synchronize()
    result = compare(out, expected, torch.bfloat16)
    assert result.ok, f"{mode}: {result}"


def test_decode_unaligned_cache_takes_plain_loads_gpu(arch):
    """A cache view whose base is off 16 bytes (no TMA descriptor) gives the same results."""
    hq, hkv = LAYOUTS["tp4"]
    case = cases.decode_case(arch=arch, seq_lens=[300, 2100, 9000], num_q_heads=hq, num_kv_heads=hkv,
                             kv_dtype="fp8", scale_mode="scalar", q_dtype=torch.bfloat16, device="cuda", seed=6)
    kv = case.args["kv_cache"]
    shifted = torch.empty(kv.numel() + 1, dtype=kv.dtype, device="cuda")[1:].view(kv.shape)
    shifted.copy_(kv)
    assert shifted.data_ptr() % 16 != 0
    case.args["kv_cache"] = shifted
    _check(case, gpu_suite.DECODE_FUSED)


def _unaligned_rows(kv):
    """The same cache as a [pages, Hkv, 128, 2D + 8] buffer's [..., :2D] view (NaN in the padding): a
    token stride of 2D + 8 elements, which neither TMA nor Triton's alignment hints take."""
    pages, hkv, page, width = kv.shape
    wide = torch.full((pages, hkv, page, width + 8), float("nan"), device=kv.device).to(kv.dtype)
    view = wide[..., :width]
    view.copy_(kv)
    return view


@pytest.mark.parametrize("mode", ["per_token_head", "scalar"])
@pytest.mark.parametrize("selection", ["auto", "tiled", "per_token"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_prefill_over_unaligned_rows_gpu(arch, layout, selection, mode):
    """Issue 35: the shipped tables' prefill over a cache whose rows are not 16-byte aligned came
    back wrong with per_token_head (rel L2 0.15-0.9): kv_upcast 3's per-key V conversions need a
    key's values packed together, which plain loads of such rows do not give. A lone token after a
    short prefix, a short prompt and 1089 tokens of random selections, per selection path."""
    hq, hkv = LAYOUTS[layout]
    case = cases.prefill_case(arch=arch, q_lens=[1, 10, 1089], prefix_lens=[12, 0, 0], num_q_heads=hq,
                              num_kv_heads=hkv, kv_dtype="fp8", scale_mode=mode, q_dtype=torch.bfloat16,
                              device="cuda", seed=35, pattern="random")
    case.args["kv_cache"] = _unaligned_rows(case.args["kv_cache"])
    _check(case, None, selection=selection)


@pytest.mark.parametrize("pattern", ["correlated", "random"])
@pytest.mark.parametrize("block_t", [2, 4, 8])
def test_one_launch_decision_matches_the_torch_estimate_gpu(arch, pattern, block_t):
    """codegen.selection_kernel on the device, in a CUDA graph replayed three times (its counters
    must return to zero): the same inflation and offsets as the torch estimate, over 300 requests
    (the binary search over cu_seqlens) with prefixes on both sides of the 16-block mark."""
    from codegen import selection, selection_kernel

    gen = torch.Generator().manual_seed(block_t)
    q_lens = torch.randint(1, 40, (300,), generator=gen).tolist()
    prefix_lens = torch.randint(0, 9000, (300,), generator=gen).tolist()
    case = cases.prefill_case(arch=arch, pattern=pattern, seed=block_t, q_lens=q_lens, prefix_lens=prefix_lens,
                              num_q_heads=16, num_kv_heads=2, head_dim=64, q_dtype=torch.bfloat16, device="cuda")
    a = case.args
    want = selection.tile_inflation(a["topk_idx"], block_t, a["cu_seqlens_q"], a["prefix_lens"]).item()
    threshold = selection.tiles_pay_off_below(block_t, "scalar")
    want_tiled, want_per_token = selection.split_seqlens(a["cu_seqlens_q"], torch.tensor(want <= threshold))
    got = torch.full((1,), float("nan"), device="cuda")
    args = (a["topk_idx"], block_t, threshold, a["cu_seqlens_q"], a["prefix_lens"], selection.SAMPLED_TILES, got)
    selection_kernel.decide_and_split(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiled, per_token = selection_kernel.decide_and_split(*args)
    for _ in range(3):
        got.fill_(float("nan"))
        tiled.fill_(-1)
        per_token.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert got.item() == pytest.approx(want, rel=1e-6)
        assert torch.equal(tiled, want_tiled.to(tiled.device)) and torch.equal(per_token, want_per_token.to(tiled.device))


_TUNED = gpu_suite.tuned_entries(REPO_CONFIG_DIR / "sm90__NVIDIA_H200.json")


@pytest.mark.parametrize("entry", _TUNED, ids=[entry.id for entry in _TUNED])
def test_tuned_table_config_gpu(arch, entry):
    """Every distinct config of the H200's tuned table (the configs users get) compiles, runs and is
    right, once, at its bucket's shape or a smaller one (codegen.gpu_suite.tuned_case_shape)."""
    if arch != "sm90":
        pytest.skip(f"the table is sm90's; this device is {arch}")
    case = cases.serving_case(entry.table.split("/")[0], arch=arch, seed=13, **gpu_suite.tuned_case_shape(entry))
    kw = {} if case.kernel == "decode" else {"selection": "per_token" if entry.per_token else "tiled"}
    _check(case, entry.config, **kw)


def test_this_gpu_runs_a_tuned_table_gpu(arch):
    """An H200 reads its own table, an H100 borrows it (tuned_store.BORROWED_TABLES): on either the API's
    lookup for a served shape is tuned, and the reason says whose table. Other GPUs: skipped."""
    from codegen import get_config, loader, tuned_store

    name = torch.cuda.get_device_name()
    device = tuned_store.normalize_device_name(name)
    if (arch, device) != ("sm90", "NVIDIA_H200") and tuned_store.lender(arch, name) != "NVIDIA_H200":
        pytest.skip(f"{name} ({arch}) neither has the H200's table nor borrows it")
    choice = get_config("decode", arch, name, "scalar", "fp8", 16, 1, 32)
    assert choice.is_tuned, choice.reason
    own_file = any((folder / tuned_store.file_name(arch, name)).is_file() for folder in loader.config_dirs())
    if device != "NVIDIA_H200" and not own_file:  # none is shipped: the H200's, borrowed
        assert f"sm90__NVIDIA_H200.json (borrowed by {device}" in choice.reason, choice.reason


_TUNED_DECODE = [entry for entry in _TUNED if entry.table.startswith("decode")]


@pytest.mark.parametrize("entry", _TUNED_DECODE, ids=[entry.id for entry in _TUNED_DECODE])
def test_tuned_decode_config_on_four_token_requests_gpu(arch, entry):
    """Every decode config of the H200's table on 4-token requests (speculative verify): Triton
    compiles it apart from single-token decode, with its own score masking (MASK_ALL_SLICES)."""
    if arch != "sm90":
        pytest.skip(f"the table is sm90's; this device is {arch}")
    case = cases.serving_case("decode", arch=arch, seed=17, **gpu_suite.tuned_case_shape(entry, query_len=4))
    _check(case, entry.config)
