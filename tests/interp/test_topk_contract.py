"""vLLM's top-k contract (docs/contract.md): a token at position p reads only the first
n = min(topk, p // 128 + 1) entries of its top-k row. Whatever follows them (the own block again,
-1, stale ids, ids past the request, 2**31 - 1) changes nothing and is never used as an index;
within the first n, a -1 or an id outside the request's blocks contributes nothing; a token's
output depends on its own row only, also inside a multi-token tile.

Small shapes where most tokens have n < topk (positions below topk x 128), so most rows have a
tail; fp32 queries (tolerance 1e-5, see codegen/accuracy.py)."""
import importlib.util
import sys

import pytest
import torch

from codegen import LaunchConfig, cases, render
from codegen.accuracy import compare
from codegen.variants import ARCHS, Variant

SMALL = dict(head_dim=32, topk=4)
# (kernel, config): prefill's per-token walk and 4-token tiles; decode in one split and in three
# (partials merged by the second launch, or by the last split program with a fused merge).
PATHS = {
    "prefill_per_token": ("prefill", dict(block_n=32, block_t=1)),
    "prefill_tiles": ("prefill", dict(block_n=32, block_t=4)),
    "decode_one_split": ("decode", dict(block_n=64, num_splits=1)),
    "decode_split_merge": ("decode", dict(block_n=64, num_splits=3)),
    "decode_fused_merge": ("decode", dict(block_n=64, num_splits=3, fused_merge=1)),
}


def _config(arch, **kw):
    amd = dict(num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16) if ARCHS[arch].amd_knobs else {}
    return LaunchConfig(**amd, **kw)


def _case(kernel, arch, seed, **kw):
    if kernel == "prefill":
        # A prompt without prefix (n grows 1..4 over its first 512 tokens), one after a short
        # prefix whose tile crosses a page boundary.
        return cases.prefill_case(arch=arch, q_lens=[9, 6], prefix_lens=[0, 250], num_q_heads=8, num_kv_heads=2,
                                  seed=seed, **SMALL, **kw)
    return cases.decode_case(arch=arch, seq_lens=[60, 200, 300, 700], decode_query_len=2, num_q_heads=8,
                             num_kv_heads=2, padded_rows=1, seed=seed, **SMALL, **kw)


def _run(case, arch, config):
    case.poison()
    out = cases.run_kernel(case, arch=arch, config=config)
    return compare(out, cases.run_reference(case), torch.float32)


# Every tail on sm90; gfx942 (same kernels, its fp8 type and launch knobs) on vLLM's tail and the mix.
TAIL_ARCHS = [("sm90", tail) for tail in cases.TAILS] + [("gfx942", "own"), ("gfx942", "mixed")]


@pytest.mark.parametrize("arch,tail", TAIL_ARCHS)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_entries_past_n_are_never_read(arch, path, tail):
    kernel, config = PATHS[path]
    case = _case(kernel, arch, seed=len(tail), tail=tail)
    result = _run(case, arch, _config(arch, **config))
    assert result.ok, f"{arch} {path} tail={tail}: {result}"


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("mode,kv_dtype", [("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "bf16")])
def test_junk_inside_the_first_n_contributes_nothing(arch, path, mode, kv_dtype):
    kernel, config = PATHS[path]
    case = _case(kernel, arch, seed=5, tail="mixed", inner_junk=0.3, scale_mode=mode, kv_dtype=kv_dtype)
    ids = case.args["topk_idx"]
    assert bool(((ids < 0) | (ids >= 10)).any()), "the case must hold junk ids"
    result = _run(case, arch, _config(arch, **config))
    assert result.ok, f"{arch} {path} {mode}: {result}"


def test_tails_do_not_change_the_result():
    """The same inputs with two different tails: the kernel's outputs are identical."""
    outs = []
    for tail in ("own", "max"):
        case = _case("prefill", "sm90", seed=1, tail=tail)
        outs.append(cases.run_kernel(case, arch="sm90", config=_config("sm90", block_n=32, block_t=4)).clone())
    assert torch.equal(outs[0], outs[1])


def _tiny_prefill(rows, prefix):
    """One request, Hq = Hkv = 1, D = 16: len(rows) tokens after `prefix`, rows given verbatim."""
    case = cases.prefill_case(arch="sm90", q_lens=[len(rows)], prefix_lens=[prefix], num_q_heads=1,
                              num_kv_heads=1, head_dim=16, topk=len(rows[0]), seed=9, future_prob=0.0)
    case.args["topk_idx"] = torch.tensor([rows], dtype=torch.int32)
    return case


@pytest.mark.parametrize("block_t", [1, 2])
def test_a_block_listed_twice_changes_only_its_own_token(block_t):
    """Token 0 lists block 1 twice, token 1 once: the tile loads the page once and weights each
    row by its own listings (as the per-token walk and vLLM do), so token 1 is not affected."""
    case = _tiny_prefill([[1, 1], [1, 0]], prefix=200)
    result = _run(case, "sm90", LaunchConfig(block_n=32, block_t=block_t))
    assert result.ok, f"block_t={block_t}: {result}"


@pytest.mark.parametrize("kernel,row,block_t", [
    ("decode", [2, 2 ** 24], 1), ("decode", [2, 2 ** 31 - 1], 1),
    ("prefill", [2, 2 ** 31 - 1], 1), ("prefill", [2, 2 ** 31 - 1], 2), ("prefill", [2, -(2 ** 31)], 2),
])
def test_huge_ids_inside_the_first_n_are_never_dereferenced(kernel, row, block_t):
    """An id near 2**31 once wrapped the int32 position test and read the block table at it."""
    if kernel == "decode":
        case = cases.decode_case(arch="sm90", seq_lens=[300], num_q_heads=1, num_kv_heads=1, head_dim=16, topk=2,
                                 seed=4)
        case.args["topk_idx"] = torch.tensor([[row]], dtype=torch.int32)
        config = LaunchConfig(block_n=32, num_splits=2)
    else:
        case = _tiny_prefill([row, row], prefix=298)
        config = LaunchConfig(block_n=32, block_t=block_t)
    result = _run(case, "sm90", config)
    assert result.ok, f"{kernel} {row} block_t={block_t}: {result}"


# --- the gate is sharp: a kernel that reads one entry past n fails it --------------------------

# Mutations of the rendered source that make a kernel read one entry past its n (and only that).
READS_ONE_MORE = {
    "decode_split": [("n_read = tl.minimum(topk, n_causal)", "n_read = tl.minimum(topk, n_causal + 1)")],
    "prefill": [
        ("n_read = tl.minimum(topk, n_causal)", "n_read = tl.minimum(topk, n_causal + 1)"),
        ("read_f = (te_f < n_tok) & (ke_f < n_read_f)", "read_f = (te_f < n_tok) & (ke_f < tl.minimum(n_read_f + 1, topk))"),
        ("mask=offs_k < tl.where(tt < n_tok, n_read_tt, 0)", "mask=offs_k < tl.where(tt < n_tok, tl.minimum(n_read_tt + 1, topk), 0)"),
    ],
}


def _mutant_module(tmp_path, arch, kernel, scale_mode):
    """The generated module with READS_ONE_MORE applied, imported from a file (Triton's jit reads
    the kernel's source from it)."""
    text = render.render(Variant(arch, kernel, scale_mode)).text
    for old, new in READS_ONE_MORE[kernel]:
        assert old in text, f"mutation target gone from the {kernel} template: {old!r}"
        text = text.replace(old, new)
    path = tmp_path / f"mutant_{arch}_{kernel}_{scale_mode}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["prefill_per_token", "prefill_tiles", "decode_one_split"])
def test_the_gate_fails_a_kernel_that_reads_one_entry_past_n(path, monkeypatch, tmp_path):
    from codegen import api, plan

    kernel, config = PATHS[path]
    part = "decode_split" if kernel == "decode" else "prefill"
    case = _case(kernel, "sm90", seed=3)  # the default, vLLM's tails: the own block again
    assert _run(case, "sm90", _config("sm90", **config)).ok, "the shipped kernel must pass first"
    mutant = _mutant_module(tmp_path, "sm90", part, "scalar")
    real = api.load_module
    monkeypatch.setattr(api, "load_module", lambda arch, k, *a: mutant if k == part else real(arch, k, *a))
    plan.PLANS.clear()  # the shipped kernel's plan for this shape would serve the call otherwise
    result = _run(case, "sm90", _config("sm90", **config))
    assert not result.ok, f"{path}: reading one entry past n went unnoticed ({result})"
