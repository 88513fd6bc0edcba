"""Inputs built like real serving, for the accuracy gates, the tuner and the benchmark.

Random physical page order, a token-major (strided) cache view, a transposed top-k view, the own
block plus distinct earlier blocks, ragged requests with and without prefix, uniform and varlen
decode with speculative rows and padded rows. Never zeros. A token reads only the first
min(topk, p // 128 + 1) entries of its row (p its position); what follows them is filled as vLLM's
tests do (the own block again) unless `tail` asks for -1, stale or out-of-range ids.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from .shapes import torch_dtype
from .variants import PAGE_SIZE


@dataclasses.dataclass
class Case:
    kernel: str  # "prefill" or "decode"
    args: dict  # keyword arguments of sparse_attn_prefill / sparse_attn_decode (and the references)
    scale_mode: str

    @property
    def output(self) -> torch.Tensor:
        return self.args["output"]

    def poison(self) -> None:
        """Fills the output with NaN so an unwritten element can never pass."""
        self.output.fill_(float("nan"))

    def refill_from(self, other: "Case") -> None:
        """Copies `other`'s inputs into this case's tensors (same shapes) and poisons the output: a
        CUDA graph captured on this case then replays on other's data."""
        for name, value in other.args.items():
            if isinstance(value, torch.Tensor) and name != "output":
                self.args[name].copy_(value)
        self.poison()

    def poison_past_the_end(self) -> None:
        """Fills the slots past each request's length in its last page, which no query may see, with
        NaN (for fp8 its NaN encoding: 0x7f e4m3fn, 0x80 e4m3fnuz; the GPU decodes it as NaN, the
        interpreter does not): a kernel that reads whole pages must still never use them."""
        for req, seq_len in enumerate(self.args["seq_lens"].tolist()):
            if seq_len > 0:
                last_block = (seq_len - 1) // PAGE_SIZE
                page = int(self.args["block_table"][req, last_block])
                self.args["kv_cache"][page, :, seq_len - last_block * PAGE_SIZE:, :] = float("nan")


def _paged_cache(gen, num_pages, num_kv_heads, head_dim, dtype, device, strided):
    """Cache [num_pages, Hkv, 128, 2D]; strided=True gives a token-major physical layout view."""
    if strided:
        base = torch.randn(num_pages, PAGE_SIZE, num_kv_heads, 2 * head_dim, generator=gen, device=device)
        return base.to(dtype).permute(0, 2, 1, 3)
    return torch.randn(num_pages, num_kv_heads, PAGE_SIZE, 2 * head_dim, generator=gen, device=device).to(dtype)


def _scales(gen, scale_mode, num_kv_heads, num_pages, device):
    if scale_mode == "none":
        return None, None
    if scale_mode == "scalar":
        # Non-power-of-two values: a misplaced scale must change the result visibly.
        kv = 0.5 + 0.6 * torch.rand(2, generator=gen, device=device)
        return kv[0:1].clone(), kv[1:2].clone()
    # per_token_head: [Hkv, N] views with non-unit strides and a few spare slots.
    slots = num_pages * PAGE_SIZE + 64
    k = (0.5 + 0.6 * torch.rand(slots, num_kv_heads, generator=gen, device=device)).t()
    v = (0.5 + 0.6 * torch.rand(slots, num_kv_heads, generator=gen, device=device)).t()
    return k, v


# What fills a row past the entries its token reads (`tail=`): vLLM's tests and benchmarks repeat
# the own block; -1 (older indexers); stale ids of the request (earlier, own or future blocks);
# ids past the request's blocks; the largest int32; or a mix of all of them.
TAILS = ("own", "-1", "stale", "past", "max", "mixed")
INT32_MAX = 2 ** 31 - 1


def _junk_ids(gen, kind, shape, own, blocks, device):
    """Ids of one `TAILS` kind, [Hkv, T, topk] (own and blocks are per row: [1, T, 1])."""
    rand = lambda hi: (torch.rand(shape, generator=gen, device=device) * hi).long()  # noqa: E731
    if kind == "own":
        return own.expand(shape)
    if kind == "-1":
        return torch.full(shape, -1, device=device)
    if kind == "stale":
        return rand(blocks.clamp(min=1).float())
    if kind == "past":
        return blocks + rand(1000.0)
    if kind == "max":
        return torch.full(shape, INT32_MAX, device=device)
    if kind == "mixed":
        kinds = [_junk_ids(gen, k, shape, own, blocks, device) for k in TAILS[:-1]]
        kinds.append(torch.full(shape, -3, device=device))
        kinds.append(torch.full(shape, 10 ** 6, device=device))
        which = rand(float(len(kinds)))
        return torch.gather(torch.stack(kinds), 0, which[None]).squeeze(0)
    raise ValueError(f"tail: expected one of {TAILS}, got {kind!r}")


def _entries_read(q_pos: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, topk] bool: the entries of each row that its token (at position q_pos) reads, by the
    contract's formula min(topk, p // 128 + 1). Written here on purpose rather than taken from
    codegen.reference, which the runtime shares: inputs built by the runtime's own count would move
    with it if that count were wrong."""
    n = torch.clamp(q_pos // PAGE_SIZE + 1, max=topk)
    return torch.arange(topk, device=q_pos.device)[None, :] < n[:, None]


def _select(gen, q_pos, req_of_row, blocks_of_req, num_kv_heads, topk, pattern, future_prob, tail="own",
            inner_junk=0.0):
    """Top-k logical blocks per (KV head, query row): [Hkv, T, topk] int32.

    A row's first n = min(topk, p // 128 + 1) entries (p the row's position, what a kernel reads)
    hold the own block and distinct earlier blocks, random or (pattern "correlated") the top of a
    per-(request, head) block score plus small per-token noise, in random order; with
    `future_prob`, a row may also select the block after its own (all keys invisible: it must
    contribute nothing). The entries past n are filled by `tail` (TAILS). With `inner_junk`, each
    of the first n entries is replaced with that probability by an id that must contribute nothing
    (-1, past the request's blocks, the largest int32).
    """
    rows, width = q_pos.shape[0], max(int(blocks_of_req.max()) if len(blocks_of_req) else 1, 1)
    dev = q_pos.device
    blk = torch.arange(width, device=dev)[None, None, :]
    own = (q_pos // PAGE_SIZE)[None, :, None]
    if pattern == "correlated":
        shared = torch.randn(num_kv_heads, len(blocks_of_req), width, generator=gen, device=dev)
        score = shared[:, req_of_row] + 0.1 * torch.randn(num_kv_heads, rows, width, generator=gen, device=dev)
    elif pattern == "random":
        score = torch.rand(num_kv_heads, rows, width, generator=gen, device=dev)
    else:
        raise ValueError(f"pattern: expected 'random' or 'correlated', got {pattern!r}")
    if tail not in TAILS:
        raise ValueError(f"tail: expected one of {TAILS}, got {tail!r}")
    allowed = (blk < own).expand(num_kv_heads, rows, width).clone()
    if future_prob:
        exists = blk < blocks_of_req[req_of_row][None, :, None]
        lucky = torch.rand(num_kv_heads, rows, 1, generator=gen, device=dev) < future_prob
        allowed |= (blk == own + 1) & exists & lucky
    score = torch.where(allowed, score, float("-inf"))
    score = torch.where(blk == own, float("inf"), score)
    k = min(topk, width)
    values, ids = score.topk(k, dim=-1)
    ids = torch.where(values > float("-inf"), ids, -1)
    if k < topk:
        ids = torch.cat([ids, torch.full((num_kv_heads, rows, topk - k), -1, device=dev)], dim=-1)
    # Shuffle the picks (never fewer than n of them: the own block and every earlier one are allowed).
    key = torch.rand(num_kv_heads, rows, topk, generator=gen, device=dev) + (ids < 0) * 2.0
    ids = torch.gather(ids, -1, key.argsort(dim=-1))
    shape = ids.shape
    blocks = blocks_of_req[req_of_row][None, :, None]
    read = _entries_read(q_pos, topk)[None]  # [1, T, topk]: the entries each row's token reads
    ids = torch.where(read, ids, _junk_ids(gen, tail, shape, own, blocks, dev))
    if inner_junk:
        junk = _junk_ids(gen, "mixed", shape, own, blocks, dev)
        junk = torch.where((junk >= 0) & (junk < blocks), -1, junk)  # never a block that counts
        hit = torch.rand(shape, generator=gen, device=dev) < inner_junk
        ids = torch.where(read & hit, junk, ids)
    return ids.to(torch.int32)


def _block_tables(gen, seq_lens, selected, req_of_row, compact):
    """[num_reqs, max_blocks] logical -> physical, every used block on its own page, random order.

    compact=False gives every logical block of every request a page (small tests); compact=True
    only the selected blocks (large benchmarks: the cache then holds just what is read).
    Unused entries point at random pages: reading one by mistake gives a wrong (caught) answer.
    """
    blocks = [math.ceil(s / PAGE_SIZE) for s in seq_lens]
    width = max(max(blocks, default=1), 1)
    dev = selected.device
    used = torch.zeros(len(seq_lens), width, dtype=torch.bool, device=dev)
    if compact:
        sel = selected.permute(1, 0, 2).reshape(selected.shape[1], -1).long()  # [T, Hkv*topk]
        req = req_of_row[:, None].expand_as(sel)
        ok = (sel >= 0) & (sel < torch.tensor(blocks, device=dev)[req])  # a request's own blocks only
        used[req[ok], sel[ok]] = True
    else:
        used = torch.arange(width, device=dev)[None, :] < torch.tensor(blocks, device=dev)[:, None]
    num_pages = int(used.sum()) + 2
    table = torch.randint(0, num_pages, (len(seq_lens), width), generator=gen, dtype=torch.int32, device=dev)
    table[used] = torch.randperm(num_pages, generator=gen, device=dev)[: int(used.sum())].to(torch.int32)
    return table, num_pages


def _topk_view(selected):
    """[Hkv, T, topk] as a transposed view of a [T, Hkv, topk] buffer (the common layout)."""
    return selected.permute(1, 0, 2).contiguous().permute(1, 0, 2)


def prefill_case(*, arch: str, q_lens, prefix_lens, num_q_heads: int, num_kv_heads: int, head_dim: int = 128,
                 topk: int = 16, kv_dtype: str = "fp8", scale_mode: str = "scalar", q_dtype=torch.float32,
                 device="cpu", seed: int = 0, pattern: str = "random", strided: bool = True,
                 compact: bool = False, future_prob: float = 0.3, tail: str = "own", inner_junk: float = 0.0) -> Case:
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    seq_lens = [p + n for p, n in zip(prefix_lens, q_lens)]
    longs = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    req_of_row = torch.repeat_interleave(longs(list(range(len(q_lens)))), longs(list(q_lens)))
    first = longs([0] + list(q_lens)).cumsum(0)[:-1]
    q_pos = longs(list(prefix_lens))[req_of_row] + torch.arange(len(req_of_row), device=device) - first[req_of_row]
    blocks_of_req = longs([math.ceil(s / PAGE_SIZE) for s in seq_lens])
    selected = _select(gen, q_pos, req_of_row, blocks_of_req, num_kv_heads, topk, pattern, future_prob, tail,
                       inner_junk)
    table, num_pages = _block_tables(gen, seq_lens, selected, req_of_row, compact)
    total_q = sum(q_lens)
    cu = torch.tensor([0] + list(q_lens), dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    k_scale, v_scale = _scales(gen, scale_mode, num_kv_heads, num_pages, device)
    args = dict(
        q=torch.randn(total_q, num_q_heads, head_dim, generator=gen, device=device).to(q_dtype),
        kv_cache=_paged_cache(gen, num_pages, num_kv_heads, head_dim, torch_dtype(arch, kv_dtype), device, strided),
        topk_idx=_topk_view(selected),
        block_table=table,
        cu_seqlens_q=cu,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=device),
        max_query_len=max(q_lens, default=0),
        num_kv_heads=num_kv_heads,
        sm_scale=head_dim ** -0.5,
        output=torch.empty(total_q, num_q_heads, head_dim, dtype=q_dtype, device=device),
        k_scale=k_scale,
        v_scale=v_scale,
    )
    return Case("prefill", args, scale_mode)


def decode_case(*, arch: str, seq_lens, num_q_heads: int, num_kv_heads: int, head_dim: int = 128, topk: int = 16,
                kv_dtype: str = "fp8", scale_mode: str = "scalar", q_dtype=torch.float32, device="cpu", seed: int = 0,
                decode_query_len: int = 1, varlen_q_lens=None, padded_rows: int = 0, strided: bool = True,
                compact: bool = False, tail: str = "own", inner_junk: float = 0.0) -> Case:
    """Uniform decode (decode_query_len per request) or varlen (varlen_q_lens, 0 allowed), plus
    `padded_rows` rows past the last real token (as in a padded CUDA-graph batch). `tail` and
    `inner_junk`: what fills a row past the entries its token reads, and junk among them (_select)."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    q_lens = list(varlen_q_lens) if varlen_q_lens is not None else [decode_query_len] * len(seq_lens)
    real, total_q = sum(q_lens), sum(q_lens) + padded_rows
    longs = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    req_of_row = torch.repeat_interleave(longs(list(range(len(q_lens)))), longs(q_lens))
    first = longs([0] + q_lens).cumsum(0)[:-1]
    q_pos = longs(list(seq_lens))[req_of_row] - longs(q_lens)[req_of_row] + torch.arange(real, device=device) - first[req_of_row]
    blocks_of_req = longs([math.ceil(s / PAGE_SIZE) for s in seq_lens])
    selected = _select(gen, q_pos, req_of_row, blocks_of_req, num_kv_heads, topk, "random", 0.0, tail, inner_junk)
    table, num_pages = _block_tables(gen, seq_lens, selected, req_of_row, compact)
    # Padded rows hold garbage ids: a kernel that reads them fails (wrong answer or fault).
    garbage = torch.randint(-(2 ** 20), 2 ** 20, (num_kv_heads, padded_rows, topk), generator=gen, dtype=torch.int32,
                            device=device)
    selected = torch.cat([selected, garbage], dim=1)
    k_scale, v_scale = _scales(gen, scale_mode, num_kv_heads, num_pages, device)
    args = dict(
        q=torch.randn(total_q, num_q_heads, head_dim, generator=gen, device=device).to(q_dtype),
        kv_cache=_paged_cache(gen, num_pages, num_kv_heads, head_dim, torch_dtype(arch, kv_dtype), device, strided),
        topk_idx=_topk_view(selected),
        block_table=table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_kv_heads=num_kv_heads,
        sm_scale=head_dim ** -0.5,
        output=torch.empty(total_q, num_q_heads, head_dim, dtype=q_dtype, device=device),
        decode_query_len=decode_query_len,
        k_scale=k_scale,
        v_scale=v_scale,
        query_start_loc=None,
        token_to_req_indices=None,
    )
    if varlen_q_lens is not None:
        starts = [0] + torch.tensor(q_lens).cumsum(0).tolist()
        t2r = req_of_row.tolist() + torch.randint(-1000, 1000, (padded_rows,), generator=gen, device=device).tolist()
        args["query_start_loc"] = torch.tensor(starts, dtype=torch.int32, device=device)
        args["token_to_req_indices"] = torch.tensor(t2r, dtype=torch.int32, device=device)
    return Case("decode", args, scale_mode)


def serving_case(kernel: str, *, arch: str, num_q_heads: int, num_kv_heads: int, kv_dtype: str, scale_mode: str,
                 batch: int, tokens: int, context: int, pattern: str = "correlated", head_dim: int = 128,
                 topk: int = 16, q_dtype=torch.bfloat16, device="cuda", seed: int = 0, tail: str = "own") -> Case:
    """The inputs the tuner and the benchmark time: `batch` requests of `tokens` query tokens each
    (decode: the query length; prefill: the chunk) after `context` cached tokens, pages allocated
    only where selected, no selected future blocks, rows past their read entries filled by `tail`."""
    common = dict(arch=arch, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, topk=topk,
                  kv_dtype=kv_dtype, scale_mode=scale_mode, q_dtype=q_dtype, device=device, seed=seed, compact=True,
                  tail=tail)
    if kernel == "decode":
        return decode_case(seq_lens=[context] * batch, decode_query_len=tokens, **common)
    if kernel == "prefill":
        return prefill_case(q_lens=[tokens] * batch, prefix_lens=[context] * batch, pattern=pattern, future_prob=0.0,
                            **common)
    raise ValueError(f"kernel: expected 'prefill' or 'decode', got {kernel!r}")


def run_kernel(case: Case, **kw):
    from .api import sparse_attn_decode, sparse_attn_prefill

    fn = sparse_attn_prefill if case.kernel == "prefill" else sparse_attn_decode
    return fn(**case.args, **kw)


@contextlib.contextmanager
def prefill_launch_offsets():
    """Yields {block_t: the cu_seqlens_q tensor that launch reads} for the prefill launches of the call
    plans built inside the block (a cached plan builds nothing: codegen.plan.forget_plans() first, or
    capture a CUDA graph). With selection='auto' the decision fills them, after the call or each replay:
    the call's offsets for the path taken, zeros for the other. Both paths compute the same output, so
    accuracy alone cannot tell which one ran."""
    from . import api

    offsets: dict[int, torch.Tensor] = {}
    real = api.load_module

    class _Spy:
        def __init__(self, module):
            self._module = module

        def launch(self, *args, **kwargs):
            offsets[args[-1].block_t] = args[4]  # cu_seqlens_q; the config is the last positional argument
            return self._module.launch(*args, **kwargs)

        def __getattr__(self, name):  # everything else the API reads of a module (KERNEL, unsupported, ...)
            return getattr(self._module, name)

    api.load_module = lambda *a: _Spy(real(*a))
    try:
        yield offsets
    finally:
        api.load_module = real


def run_reference(case: Case, dtype=torch.float64, *, on_device: bool = False, chunk_tokens: int = 64):
    """The reference output of `case`: the plain per-token loop on the CPU (small cases), or with
    on_device=True the same function vectorized on the inputs' device (reference_batched; the GPU
    tests at the model's sizes, where the CPU loop was most of a test's time). `chunk_tokens`
    bounds the device memory gathered at once (float64 at 64 query heads: ~0.5 GB per 64 tokens)."""
    from .reference import reference_batched, reference_decode, reference_prefill

    if on_device:
        return reference_batched(case.kernel, case.args, dtype=dtype, chunk_tokens=chunk_tokens)
    args = dict(case.args, output=None)
    fn = reference_prefill if case.kernel == "prefill" else reference_decode
    return fn(**args, dtype=dtype)
