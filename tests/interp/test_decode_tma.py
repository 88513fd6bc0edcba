"""The sm90 decode kernel reads whole K/V slices through TMA boxes, invisible slots included:
whatever those hold (NaN here) must not reach the output. A cache a TMA descriptor cannot address
(a base off 16 bytes) takes the plain-load path instead, with the same results. Small shapes, fp32
queries and a bf16 cache (a bf16 NaN decodes as NaN in the interpreter; an fp8 one does not)."""
import pytest
import torch

from codegen import LaunchConfig, cases
from codegen.accuracy import compare
from codegen.modules import load_module

SMALL = dict(head_dim=32, topk=4, num_q_heads=8, num_kv_heads=2, kv_dtype="bf16", scale_mode="none")
CONFIGS = [LaunchConfig(block_n=64, num_splits=1), LaunchConfig(block_n=32, num_splits=3, fused_merge=1)]


def _case(seed=0):
    # Positions 59, 199, 299, 699: every token's own page is partly visible.
    return cases.decode_case(arch="sm90", seq_lens=[60, 200, 300, 700], seed=seed, **SMALL)


@pytest.mark.parametrize("config", CONFIGS, ids=["one_split", "fused_merge"])
def test_nan_past_the_visible_end_never_reaches_the_output(config):
    case = _case()
    expected = cases.run_reference(case)
    assert load_module("sm90", "decode_split", "none").kv_tma_ok(case.args["kv_cache"], 32)
    case.poison_past_the_end()
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=config)
    assert torch.isfinite(out).all()
    assert compare(out, expected, torch.float32).ok


def test_a_cache_tma_cannot_address_takes_plain_loads():
    case = _case(seed=1)
    kv = case.args["kv_cache"]
    # The same values one bf16 element past a 16-byte boundary: no TMA descriptor for this base.
    storage = torch.empty(kv.numel() + 1, dtype=kv.dtype)
    shifted = storage[1:].view(kv.shape)
    shifted.copy_(kv)
    module = load_module("sm90", "decode_split", "none")
    assert module.kv_tma_ok(kv, 32) and not module.kv_tma_ok(shifted, 32)
    expected = cases.run_reference(case)
    case.args["kv_cache"] = shifted
    case.poison()
    out = cases.run_kernel(case, arch="sm90", config=CONFIGS[1])
    assert compare(out, expected, torch.float32).ok
