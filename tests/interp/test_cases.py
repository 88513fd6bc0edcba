"""The serving-like inputs have the properties the gates rely on."""
import pytest
import torch

from codegen import cases
from codegen.variants import PAGE_SIZE


def _rows(case):
    return case.args["topk_idx"]


@pytest.mark.parametrize("tail", ["own", "-1"])
def test_prefill_selection_properties(tail):
    case = cases.prefill_case(arch="sm90", q_lens=[50, 3], prefix_lens=[2000, 0], num_q_heads=4, num_kv_heads=2,
                              head_dim=32, topk=8, seed=5, future_prob=0.5, tail=tail)
    topk, cu = _rows(case), case.args["cu_seqlens_q"].tolist()
    assert not topk.is_contiguous(), "transposed view expected"
    assert not case.args["kv_cache"].is_contiguous(), "token-major strided cache expected"
    saw_future = saw_tail = False
    for req, prefix in enumerate(case.args["prefix_lens"].tolist()):
        for t in range(cu[req], cu[req + 1]):
            own = (prefix + t - cu[req]) // PAGE_SIZE
            n = min(topk.shape[2], own + 1)  # the entries a token reads (docs/contract.md)
            for g in range(topk.shape[0]):
                ids = topk[g, t].tolist()
                read, rest = ids[:n], ids[n:]
                assert own in read and len(set(read)) == len(read), "the own block and distinct others"
                assert all(0 <= i < own or i == own + 1 for i in read if i != own)
                assert rest == [own if tail == "own" else -1] * len(rest), "the tail as asked"
                saw_future |= own + 1 in read
                saw_tail |= bool(rest)
    assert saw_future and saw_tail


def test_tails_and_inner_junk():
    """Every tail kind fills only the entries past n; inner junk only ids that count nothing."""
    kw = dict(arch="sm90", q_lens=[40], prefix_lens=[200], num_q_heads=2, num_kv_heads=1, head_dim=16, topk=8,
              seed=1, future_prob=0.0)
    base = cases.prefill_case(**kw).args["topk_idx"]
    n = torch.clamp((200 + torch.arange(40)) // PAGE_SIZE + 1, max=8)
    read = torch.arange(8)[None, None, :] < n[None, :, None]
    for tail in cases.TAILS:
        ids = cases.prefill_case(**kw, tail=tail).args["topk_idx"]
        assert torch.equal(ids[read], base[read]), tail
    assert (cases.prefill_case(**kw, tail="max").args["topk_idx"][~read] == 2 ** 31 - 1).all()
    assert (cases.prefill_case(**kw, tail="past").args["topk_idx"][~read] >= 2).all()  # 240 keys: blocks 0, 1
    junk = cases.prefill_case(**kw, inner_junk=0.5).args["topk_idx"][read]
    changed = junk != base[read]
    assert changed.any() and ((junk[changed] < 0) | (junk[changed] >= 2)).all()
    with pytest.raises(ValueError, match="tail: expected one of"):
        cases.prefill_case(**kw, tail="zeros")


def test_decode_padded_rows_hold_garbage_and_pages_are_shuffled():
    case = cases.decode_case(arch="sm90", seq_lens=[900, 300], num_q_heads=4, num_kv_heads=1, head_dim=32, topk=4,
                             padded_rows=3, seed=2)
    assert case.args["topk_idx"][:, 2:].abs().max() > 1000
    table = case.args["block_table"]
    assert not torch.equal(table[0, :8], torch.arange(8, dtype=torch.int32)), "physical page order is random"


def test_correlated_pattern_shares_blocks_between_neighbours():
    kw = dict(arch="sm90", q_lens=[64], prefix_lens=[8192], num_q_heads=4, num_kv_heads=1, head_dim=32, seed=1,
              future_prob=0.0)
    overlap = {}
    for pattern in ("random", "correlated"):
        ids = cases.prefill_case(pattern=pattern, **kw).args["topk_idx"][0]
        a, b = ids[:-1].sort(-1).values, ids[1:].sort(-1).values
        overlap[pattern] = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / len(a)
    assert overlap["correlated"] > 2 * overlap["random"]


@pytest.mark.parametrize("tail", cases.TAILS)
def test_batched_reference_matches_the_plain_one(tail):
    """The GPU tests check against the batched reference (cases.run_reference(on_device=True)):
    it must be the plain loop's function for every tail, junk inside the read entries, selected
    future blocks, varlen and padded rows."""
    junk = dict(tail=tail, inner_junk=0.2 if tail == "mixed" else 0.0)
    for case in [
        cases.prefill_case(arch="sm90", q_lens=[7, 5], prefix_lens=[600, 1000], num_q_heads=8, num_kv_heads=2,
                           head_dim=32, topk=4, scale_mode="per_token_head", seed=3, **junk),
        cases.decode_case(arch="gfx942", seq_lens=[300, 1000, 5, 0], varlen_q_lens=[2, 0, 1, 0], num_q_heads=8,
                          num_kv_heads=2, head_dim=32, topk=4, padded_rows=2, scale_mode="scalar", seed=1, **junk),
        cases.decode_case(arch="sm90", seq_lens=[300, 1000], decode_query_len=3, num_q_heads=16, num_kv_heads=1,
                          head_dim=32, topk=4, padded_rows=2, kv_dtype="bf16", scale_mode="none", seed=1, **junk),
    ]:
        plain = cases.run_reference(case)
        batched = cases.run_reference(case, on_device=True, chunk_tokens=3)
        assert batched.dtype == torch.float64 and batched.device == case.args["q"].device
        assert torch.allclose(plain, batched, rtol=0, atol=1e-12)
        assert batched.abs().sum() > 0
