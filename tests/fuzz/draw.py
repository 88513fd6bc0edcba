"""Seeded draws over the space the API documents, and the tensors of a draw.

`draw(seed, profile)` picks a case's shape and options (a `Draw`, printable on one line);
`build(d, device, data_seed)` makes its tensors (a `Built`). The same draw built with two data seeds
gives two calls of one shape with different data: what repeated calls, plans and CUDA-graph replays
are checked with. Profiles: "gpu" (the serving space: TP1-TP8, D 64/128, topk 4-16, prefixes up to
140k, bf16/fp16 queries) and "cpu" (the interpreter: small shapes, fp32 queries).

Independent of codegen's case builders (codegen/cases.py) on purpose: the tester shares no decision
with what it tests but the arch's fp8 dtype name."""
from __future__ import annotations

import dataclasses
import math
import random

import torch

PAGE = 128
LAYOUTS = {"tp1": (64, 4), "tp2": (32, 2), "tp4": (16, 1), "tp8": (8, 1)}
MODES = (("scalar", "fp8"), ("per_token_head", "fp8"), ("none", "fp8"), ("none", "bf16"), ("none", "fp16"))
PATTERNS = ("random", "correlated", "dense")
TAILS = ("own", "-1", "stale", "past", "max", "mixed")
# Strided views a call may take (any combination): the cache token-major ([pages, 128, Hkv, 2D]
# permuted), a slice of a larger page pool, rows padded by 8 elements (not 16-byte aligned), a base
# one element off; top-k transposed from [T, Hkv, topk] or padded; q sliced from a qkv buffer; the
# output a slice of a wider buffer (its padding must stay untouched); q and output one element off 16
# bytes; per_token_head scales transposed, or one element off.
VIEWS = ("token_major", "page_slice", "unaligned_rows", "unaligned_base", "topk_transposed", "topk_padded",
         "q_from_qkv", "padded_output", "io_unaligned", "scales_transposed", "scales_offset")
_SCALE_VIEWS = ("scales_transposed", "scales_offset")
CALLS = ("eager", "repeat", "plan", "graph", "stream")
SELECTIONS = (None, "auto", "tiled", "per_token")
INT32_MAX = 2 ** 31 - 1
JUNK_PAGE = 1 << 30  # block-table entries no token may read: reading one faults instead of passing


@dataclasses.dataclass(frozen=True)
class Draw:
    seed: int
    kernel: str  # "prefill" | "decode"
    layout: str
    head_dim: int
    topk: int
    q_dtype: str  # "bf16" | "fp16" | "fp32"
    scale_mode: str
    kv_dtype: str
    pattern: str
    tail: str
    inner_junk: bool  # -1, out-of-range, future and repeated ids inside the entries a token reads
    views: tuple
    call: str
    selection: str | None  # prefill only
    outliers: bool  # a few query entries 10-30x the rest
    q_lens: tuple  # prefill: new tokens per request; decode: query tokens per request
    context: tuple  # prefill: prefix lengths; decode: seq_lens (the new tokens included)
    uniform: bool = True  # decode: decode_query_len (True) or query_start_loc + token_to_req_indices
    padded_rows: int = 0  # decode: rows past the last real token
    bounded: bool = False  # prefill: max_seq_len= the longest request (auto may take the tiles on the host)

    @property
    def heads(self) -> tuple[int, int]:
        return LAYOUTS[self.layout]

    def describe(self) -> str:
        hq, hkv = self.heads
        reqs = len(self.q_lens)
        shape = (f"{reqs} req, q {sum(self.q_lens)} tok, ctx {min(self.context)}-{max(self.context)}"
                 + (f", {'uniform' if self.uniform else 'varlen'} +{self.padded_rows} pad" if self.kernel == "decode"
                    else ""))
        sel = f" sel={self.selection}{' bounded' if self.bounded else ''}" if self.kernel == "prefill" else ""
        return (f"{self.kernel} {hq}/{hkv} D{self.head_dim} k{self.topk} q={self.q_dtype} {self.kv_dtype}/"
                f"{self.scale_mode} {self.pattern}/{self.tail}{'+junk' if self.inner_junk else ''}"
                f"{' outliers' if self.outliers else ''} [{shape}] views={','.join(self.views) or '-'} "
                f"call={self.call}{sel}")


# The issue-35 class, drawn first in every run (seeds 0..8): per_token_head over a cache with unaligned
# rows, bf16 queries, prefill, each selection path at 8/1, 16/1 and 64/4.
PINNED = tuple(dict(kernel="prefill", layout=layout, scale_mode="per_token_head", kv_dtype="fp8", q_dtype="bf16",
                    selection=selection, force_view="unaligned_rows")
               for layout in ("tp8", "tp4", "tp1") for selection in ("auto", "tiled", "per_token"))


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """`total` split into `parts` positive lengths of random sizes."""
    cuts = sorted(rng.sample(range(1, total), parts - 1)) if parts > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


def draw(seed: int, profile: str = "gpu") -> Draw:
    if profile not in ("gpu", "cpu"):
        raise ValueError(f"profile: expected 'gpu' or 'cpu', got {profile!r}")
    rng = random.Random(seed)
    pin = PINNED[seed] if profile == "gpu" and seed < len(PINNED) else {}
    cpu = profile == "cpu"
    kernel = pin.get("kernel") or rng.choice(("prefill", "decode"))
    layout = pin.get("layout") or rng.choice(("tp8", "tp4") if cpu else tuple(LAYOUTS))
    head_dim = 32 if cpu else (128 if rng.random() < 0.75 else 64)
    topk = rng.randint(2, 4) if cpu else (16 if rng.random() < 0.6 else rng.randint(4, 16))
    scale_mode, kv_dtype = (pin["scale_mode"], pin["kv_dtype"]) if pin else rng.choice(MODES)
    q_dtype = "fp32" if cpu else pin.get("q_dtype") or rng.choice(("bf16", "bf16", "fp16"))
    views = tuple(v for v in VIEWS if rng.random() < 0.25 and (v not in _SCALE_VIEWS or scale_mode == "per_token_head"))
    if pin.get("force_view") and pin["force_view"] not in views:
        views = (*views, pin["force_view"])
    if "unaligned_rows" in views and "unaligned_base" in views:
        views = tuple(v for v in views if v != "unaligned_base")
    call = rng.choice(("eager",) if cpu else ("eager", "eager", *CALLS[1:]))
    max_ctx = 700 if cpu else 140_000
    if kernel == "prefill":
        reqs = rng.randint(1, 3 if cpu else 16)
        total = max(reqs, _log_uniform(rng, reqs, 40 if cpu else 4096))
        q_lens = _split(rng, total, reqs)
        context = [0 if rng.random() < 0.3 else _log_uniform(rng, 1, max_ctx) for _ in q_lens]
        selection = pin.get("selection", rng.choice(SELECTIONS))
        uniform, padded = True, 0
    else:
        reqs = _log_uniform(rng, 1, 6 if cpu else 256)
        uniform = rng.random() < 0.5
        q_len = rng.randint(1, 2 if cpu else 4)
        q_lens = [q_len] * reqs if uniform else [rng.randint(1, 2 if cpu else 4) for _ in range(reqs)]
        context = [n + _log_uniform(rng, 1, max_ctx) for n in q_lens]
        selection, padded = None, (rng.randint(1, 8) if rng.random() < 0.3 else 0)
    return Draw(seed=seed, kernel=kernel, layout=layout, head_dim=head_dim, topk=topk, q_dtype=q_dtype,
                scale_mode=scale_mode, kv_dtype=kv_dtype, pattern=rng.choice(PATTERNS), tail=rng.choice(TAILS),
                inner_junk=rng.random() < 0.2, views=views, call=call, selection=selection,
                outliers=rng.random() < 0.15, q_lens=tuple(q_lens), context=tuple(context), uniform=uniform,
                padded_rows=padded,
                bounded=kernel == "prefill" and rng.random() < 0.5)  # drawn last: earlier seeds keep their cases


@dataclasses.dataclass
class Built:
    """A draw's tensors: `args` as the API takes them (keyword names of sparse_attn_prefill /
    sparse_attn_decode), what the reference needs (each query row's request and position, -1 for
    padded rows), and the output's wider buffer (`output_base`), whose bytes outside `args["output"]`
    hold `CANARY` and must keep it."""

    args: dict
    token_req: torch.Tensor
    token_pos: torch.Tensor
    output_base: torch.Tensor
    padded: torch.Tensor  # [T] bool: decode rows past the last real token (zeros expected)


CANARY = 12345.0


def _dtype(name: str, arch_fp8: torch.dtype) -> torch.dtype:
    return {"fp8": arch_fp8, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _rows(d: Draw) -> tuple[list[int], list[int], list[int]]:
    """Per query row: its request, its position; and the requests' seq_lens."""
    req, pos, seq_lens = [], [], []
    for r, (n, ctx) in enumerate(zip(d.q_lens, d.context)):
        seq_len = ctx + n if d.kernel == "prefill" else ctx
        first = seq_len - n  # prefill: the prefix; decode: seq_len - q_len
        req += [r] * n
        pos += list(range(first, seq_len))
        seq_lens.append(seq_len)
    return req, pos, seq_lens


def _selections(d: Draw, gen, pos, req, blocks_of_req, device) -> torch.Tensor:
    """[Hkv, T, topk] logical block ids: the own block and earlier ones first (random, correlated
    between neighbouring tokens, or every causal block in order), then the tail past what a token reads."""
    hkv, topk = d.heads[1], d.topk
    total = pos.numel()
    width = int(blocks_of_req.max())
    n_causal = pos // PAGE + 1
    own = pos // PAGE
    blk = torch.arange(width, device=device)
    if d.pattern == "dense":
        score = -blk.float().expand(hkv, total, width).clone()
    elif d.pattern == "correlated":  # a preference per (request, KV head) shared by its tokens
        pref = torch.rand(hkv, len(d.q_lens), width, generator=gen, device=device)
        score = pref[:, req] + 0.05 * torch.rand(hkv, total, width, generator=gen, device=device)
    else:
        score = torch.rand(hkv, total, width, generator=gen, device=device)
    score = score.masked_fill(blk >= n_causal[:, None], -10.0)
    score[:, torch.arange(total, device=device), own] = 10.0
    k = min(topk, width)
    ids = torch.topk(score, k, dim=-1).indices
    if k < topk:  # a request narrower than topk: the rest is tail
        ids = torch.cat([ids, ids[..., :1].expand(hkv, total, topk - k)], dim=-1)
    n_read = torch.clamp(n_causal, max=topk)
    entry = torch.arange(topk, device=device)
    if d.inner_junk:  # inside what a token reads: -1, ids past it (future or beyond the request), repeats
        junk = torch.stack([torch.full_like(ids, -1), own[None, :, None] + 1 + ids % 3, ids.roll(1, -1),
                            blocks_of_req[req][None, :, None] + ids])
        pick = torch.randint(0, 4, ids.shape, generator=gen, device=device)
        where = (torch.rand(ids.shape, generator=gen, device=device) < 0.15) & (entry > 0)
        ids = torch.where(where, junk.gather(0, pick[None]).squeeze(0), ids)
    tail = {
        "own": own[None, :, None].expand_as(ids),
        "-1": torch.full_like(ids, -1),
        "stale": torch.randint(0, width, ids.shape, generator=gen, device=device),
        "past": blocks_of_req[req][None, :, None] + torch.randint(0, 1000, ids.shape, generator=gen, device=device),
        "max": torch.full_like(ids, INT32_MAX),
    }
    if d.tail == "mixed":
        kinds = torch.stack(list(tail.values()))
        junk = kinds.gather(0, torch.randint(0, len(tail), ids.shape, generator=gen, device=device)[None]).squeeze(0)
    else:
        junk = tail[d.tail]
    ids = torch.where(entry >= n_read[None, :, None], junk, ids)
    return ids.to(torch.int32)


def _off_by_one(x: torch.Tensor, off: bool) -> torch.Tensor:
    """x's values, or a copy whose base is one element past a 16-byte boundary."""
    if not off:
        return x
    spare = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    moved = spare[1:].view(x.shape)
    moved.copy_(x)
    return moved


def build(d: Draw, device, data_seed: int, arch_fp8: torch.dtype) -> Built:
    """The tensors of `d`: the step's metadata (pages, block table) from the draw's seed, the data
    (cache, scales, q, top-k) from `data_seed`, so two builds of a draw differ only in their data."""
    device = torch.device(device)
    meta = torch.Generator(device=device).manual_seed(d.seed)
    gen = torch.Generator(device=device).manual_seed(data_seed)
    hq, hkv = d.heads
    dim, topk = d.head_dim, d.topk
    req_l, pos_l, seq_l = _rows(d)
    req = torch.tensor(req_l, dtype=torch.long, device=device)
    pos = torch.tensor(pos_l, dtype=torch.long, device=device)
    seq_lens = torch.tensor(seq_l, dtype=torch.int32, device=device)
    blocks_of_req = (seq_lens.long() + PAGE - 1) // PAGE
    q_dtype, kv_dtype = _dtype(d.q_dtype, arch_fp8), _dtype(d.kv_dtype, arch_fp8)
    real = pos.numel()
    total = real + d.padded_rows

    # Pages: one per logical block, from a pool of at most ~1 GB (blocks share pages past that).
    page_bytes = hkv * PAGE * 2 * dim * kv_dtype.itemsize
    needed = int(blocks_of_req.sum())
    pool = max(1, min(needed, (1 << 30) // page_bytes))
    distinct = pool >= needed
    if distinct:
        pages = torch.randperm(pool, generator=meta, device=device)
    else:
        pages = torch.randint(0, pool, (needed,), generator=meta, device=device)
    width = int(blocks_of_req.max()) + 3
    block_table = torch.full((len(seq_l), width), JUNK_PAGE, dtype=torch.int32, device=device)
    start = 0
    for r, nb in enumerate(blocks_of_req.tolist()):
        block_table[r, :nb] = pages[start:start + nb].to(torch.int32)
        start += nb

    # Cache: random values, NaN (or a huge value) in every slot past a request's end, and in row padding.
    pad = 8 if "unaligned_rows" in d.views else 0
    extra = 2 if "page_slice" in d.views else 0
    shape = (pool + extra, PAGE, hkv, 2 * dim + pad) if "token_major" in d.views else \
        (pool + extra, hkv, PAGE, 2 * dim + pad)
    values = torch.randn(shape, generator=gen, device=device)
    if kv_dtype == arch_fp8:
        values = values * 2.0  # fp8's range used a bit more: subnormals and 2-3 binades
    flat = values.to(kv_dtype)
    if "unaligned_base" in d.views:
        spare = torch.empty(flat.numel() + 1, dtype=kv_dtype, device=device)
        spare[1:].copy_(flat.reshape(-1))
        flat = spare[1:].view(shape)
    cache = flat.permute(0, 2, 1, 3) if "token_major" in d.views else flat
    cache = cache[extra // 2: extra // 2 + pool, ..., :2 * dim]
    nan = torch.tensor(float("nan"), device=device).to(kv_dtype)
    if pad:
        (flat.permute(0, 2, 1, 3) if "token_major" in d.views else flat)[..., 2 * dim:] = nan
    for r, seq_len in enumerate(seq_l if distinct else ()):  # a shared page may hold others' keys there
        last = (seq_len - 1) // PAGE
        cache[int(block_table[r, last]), :, seq_len - last * PAGE:] = nan

    # Scales
    k_scale = v_scale = None
    if d.scale_mode == "scalar":
        k_scale, v_scale = (0.3 + 1.7 * torch.rand(2, generator=gen, device=device)).split(1)
    elif d.scale_mode == "per_token_head":
        slots = pool * PAGE + 32
        off = 1 if "scales_offset" in d.views else 0

        def one():
            s = 0.05 + 2.0 * torch.rand(slots + off, hkv, generator=gen, device=device) ** 2
            s = s.t() if "scales_transposed" in d.views else s.t().contiguous()
            return s[:, off:]
        k_scale, v_scale = one(), one()

    # q, top-k, output
    q_base_heads = hq + 2 * hkv if "q_from_qkv" in d.views else hq
    q = torch.randn(total, q_base_heads, dim, generator=gen, device=device)
    if d.outliers:
        spots = torch.rand(q.shape, generator=gen, device=device) < 0.002
        q = torch.where(spots, q * (10 + 20 * torch.rand(q.shape, generator=gen, device=device)), q)
    q = _off_by_one(q.to(q_dtype), "io_unaligned" in d.views)[:, :hq]
    real_pos = pos
    if d.padded_rows:  # rows past the last real token: no position; their top-k rows hold junk
        pos = torch.cat([pos, torch.full((d.padded_rows,), -1, dtype=torch.long, device=device)])
        req = torch.cat([req, torch.zeros(d.padded_rows, dtype=torch.long, device=device)])
    topk_idx = _selections(d, gen, real_pos, req[:real], blocks_of_req, device)
    if d.padded_rows:
        junk = torch.randint(-5, 1 << 20, (hkv, d.padded_rows, topk), generator=gen, device=device)
        topk_idx = torch.cat([topk_idx, junk.to(torch.int32)], dim=1)
    if "topk_transposed" in d.views:
        topk_idx = topk_idx.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    elif "topk_padded" in d.views:
        wide = torch.full((hkv, total, topk + 3), -7, dtype=torch.int32, device=device)
        wide[..., :topk] = topk_idx
        topk_idx = wide[..., :topk]
    out_pad = 16 if "padded_output" in d.views else 0
    output_base = _off_by_one(torch.full((total, hq, dim + out_pad), CANARY, dtype=q_dtype, device=device),
                              "io_unaligned" in d.views)
    output = output_base[..., :dim]

    args = dict(q=q, kv_cache=cache, topk_idx=topk_idx, block_table=block_table, seq_lens=seq_lens,
                num_kv_heads=hkv, sm_scale=dim ** -0.5, output=output, k_scale=k_scale, v_scale=v_scale)
    if d.kernel == "prefill":
        cu = torch.tensor([0, *d.q_lens], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
        args.update(cu_seqlens_q=cu, prefix_lens=torch.tensor(d.context, dtype=torch.int32, device=device),
                    max_query_len=max(d.q_lens))
    elif d.uniform:
        args.update(decode_query_len=d.q_lens[0])
    else:
        starts = torch.tensor([0, *d.q_lens], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
        args.update(decode_query_len=1, query_start_loc=starts, token_to_req_indices=req.to(torch.int32))
    padded = torch.zeros(total, dtype=torch.bool, device=device)
    padded[real:] = True
    return Built(args=args, token_req=req, token_pos=pos, output_base=output_base, padded=padded)
