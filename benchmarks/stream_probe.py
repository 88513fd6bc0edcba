"""Where does decode's page stream stop? Streaming-only kernels (read the selected pages, sum them)
and the shipped decode kernel, on the decode geometry (T tokens x Hkv KV heads x 16 pages of 128
keys, fp8 K|V rows of 2 x 128 bytes), over the two cache layouts the API accepts:
  contiguous  [pages, Hkv, 128, 2D]  a (page, head) is one 32 KB run;
  strided     [pages, 128, Hkv, 2D]  viewed as the above (vLLM's token-major layout): a (page, head)
              is 128 runs of 256 B, Hkv x 256 B apart.
Streaming kernels (one program per (token, head, split), or head-fastest):
  tma      K and V boxes of BLOCK_N x 128 through the pipeliner (the split kernel's loads);
  plain    one [BLOCK_N, 256] pointer load per slice through the pipeliner (cp.async);
  prefetch one [BLOCK_N, 256] pointer load per slice, the next slice's issued before the current
           one is summed (registers, num_stages 1: no pipeliner).
Per call from one CUDA graph of `--calls` calls over two input sets; bandwidth = selected bytes /
time against a device copy measured in the same run.

  python benchmarks/stream_probe.py --out DIR
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from codegen import cases  # noqa: E402
from codegen.accuracy import compare  # noqa: E402
from codegen.configs import LaunchConfig  # noqa: E402
from codegen.modules import load_module  # noqa: E402
from codegen.static.launch import config_label  # noqa: E402
from codegen.reference import reference_decode  # noqa: E402
from codegen.timing import copy_bandwidth, graph_time  # noqa: E402
from codegen.workspace import arrival_counters  # noqa: E402

PAGE, D, TOPK = 128, 128, 16
DEVICE = "cuda"


@triton.jit
def _item(T, HKV: tl.constexpr, SPLITS: tl.constexpr, HEAD_FAST: tl.constexpr):
    pid = tl.program_id(0)
    if HEAD_FAST:
        g = pid % HKV
        s = (pid // HKV) % SPLITS
        t = pid // (HKV * SPLITS)
    else:
        t = pid % T
        g = (pid // T) % HKV
        s = pid // (T * HKV)
    return t, g, s


@triton.jit
def _item_pages(pages_ptr, T, HKV: tl.constexpr, SPLITS: tl.constexpr, HEAD_FAST: tl.constexpr,
                NPAGES: tl.constexpr):
    """(KV head, split, entry offsets, the item's NPAGES physical pages) of this program."""
    t, g, s = _item(T, HKV, SPLITS, HEAD_FAST)
    offs = tl.arange(0, NPAGES)
    return g, s, offs, tl.load(pages_ptr + (t * HKV + g) * NPAGES + offs)


@triton.jit
def _stream_tma(kv_desc, pages_ptr, out_ptr, T, HKV: tl.constexpr, SPLITS: tl.constexpr, HEAD_FAST: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NPAGES: tl.constexpr):
    g, s, offs, pages = _item_pages(pages_ptr, T, HKV, SPLITS, HEAD_FAST, NPAGES)
    PER: tl.constexpr = NPAGES // SPLITS
    SUB: tl.constexpr = 128 // BLOCK_N
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for it in range(s * PER * SUB, (s + 1) * PER * SUB):
        page = tl.sum(tl.where(offs == it // SUB, pages, 0), axis=0)
        sub = (it % SUB) * BLOCK_N
        k = kv_desc.load([page.to(tl.int32), g, sub, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = kv_desc.load([page.to(tl.int32), g, sub, HEAD_DIM]).reshape(BLOCK_N, HEAD_DIM)
        acc += tl.sum(k.to(tl.float16).to(tl.float32) + v.to(tl.float16).to(tl.float32), axis=0)
    tl.store(out_ptr + tl.program_id(0) * HEAD_DIM + tl.arange(0, HEAD_DIM), acc)


@triton.jit
def _stream_ptr(kv_ptr, pages_ptr, out_ptr, T, stride_b, stride_h, stride_t,
                HKV: tl.constexpr, SPLITS: tl.constexpr, HEAD_FAST: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NPAGES: tl.constexpr, PREFETCH: tl.constexpr):
    g, s, offs, pages = _item_pages(pages_ptr, T, HKV, SPLITS, HEAD_FAST, NPAGES)
    PER: tl.constexpr = NPAGES // SPLITS
    SUB: tl.constexpr = 128 // BLOCK_N
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, 2 * HEAD_DIM)
    head = kv_ptr + g * stride_h
    acc = tl.zeros([2 * HEAD_DIM], dtype=tl.float32)
    lo = s * PER * SUB
    hi = (s + 1) * PER * SUB
    if PREFETCH:
        page = tl.sum(tl.where(offs == lo // SUB, pages, 0), axis=0).to(tl.int64)
        nxt = tl.load(head + page * stride_b + ((lo % SUB) * BLOCK_N + rows)[:, None] * stride_t + cols[None, :])
        for it in range(lo, hi):
            cur = nxt
            more = it + 1 < hi
            page = tl.sum(tl.where(offs == (it + 1) // SUB, pages, 0), axis=0).to(tl.int64)
            nxt = tl.load(head + page * stride_b + (((it + 1) % SUB) * BLOCK_N + rows)[:, None] * stride_t
                          + cols[None, :], mask=(rows < tl.where(more, BLOCK_N, 0))[:, None], other=0.0)
            acc += tl.sum(cur.to(tl.float16).to(tl.float32), axis=0)
    else:
        for it in range(lo, hi):
            page = tl.sum(tl.where(offs == it // SUB, pages, 0), axis=0).to(tl.int64)
            kv = tl.load(head + page * stride_b + ((it % SUB) * BLOCK_N + rows)[:, None] * stride_t + cols[None, :])
            acc += tl.sum(kv.to(tl.float16).to(tl.float32), axis=0)
    tl.store(out_ptr + tl.program_id(0) * 2 * HEAD_DIM + tl.arange(0, 2 * HEAD_DIM), acc)


@triton.jit
def _stream_xor(kv_desc, kv_ptr, pages_ptr, out_ptr, T, stride_b, stride_h, stride_t,
                HKV: tl.constexpr, SPLITS: tl.constexpr, HEAD_FAST: tl.constexpr, WORDS: tl.constexpr,
                BLOCK_N: tl.constexpr, NPAGES: tl.constexpr, USE_TMA: tl.constexpr, HALVES: tl.constexpr = False):
    """The page stream with the cheapest consumer: K and V words xor-ed into a register tile, no
    reduction across threads inside the loop (the summing kernels above pay one per slice)."""
    g, s, offs, pages = _item_pages(pages_ptr, T, HKV, SPLITS, HEAD_FAST, NPAGES)
    PER: tl.constexpr = NPAGES // SPLITS
    SUB: tl.constexpr = 128 // BLOCK_N
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, 2 * WORDS)
    acc = tl.zeros([BLOCK_N, WORDS], dtype=tl.int32)
    acc2 = tl.zeros([BLOCK_N, 2 * WORDS], dtype=tl.int32)
    for it in range(s * PER * SUB, (s + 1) * PER * SUB):
        page = tl.sum(tl.where(offs == it // SUB, pages, 0), axis=0)
        sub = (it % SUB) * BLOCK_N
        if USE_TMA:
            k = kv_desc.load([page.to(tl.int32), g, sub, 0]).reshape(BLOCK_N, WORDS)
            v = kv_desc.load([page.to(tl.int32), g, sub, WORDS]).reshape(BLOCK_N, WORDS)
            acc = acc ^ k ^ v
        elif HALVES:  # K and V as two pointer loads of 128 B a row, as the decode walk's plain path
            row_ptr = kv_ptr + g * stride_h + page.to(tl.int64) * stride_b + (sub + rows)[:, None] * stride_t
            k = tl.load(row_ptr + tl.arange(0, WORDS)[None, :])
            v = tl.load(row_ptr + WORDS + tl.arange(0, WORDS)[None, :])
            acc = acc ^ k ^ v
        else:
            kv = tl.load(kv_ptr + g * stride_h + page.to(tl.int64) * stride_b + (sub + rows)[:, None] * stride_t
                         + cols[None, :])
            acc2 = acc2 ^ kv
    if USE_TMA or HALVES:
        tl.store(out_ptr + tl.program_id(0) * WORDS + tl.arange(0, WORDS), tl.xor_sum(acc, axis=0))
    else:
        tl.store(out_ptr + tl.program_id(0) * 2 * WORDS + cols, tl.xor_sum(acc2, axis=0))


def pool(num_tokens, hkv, blocks_per_token, strided, seed):
    """fp8 cache of num_tokens x blocks_per_token pages (each token's own), and each (token, head)'s
    16 selected physical pages (distinct, random)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    n = num_tokens * blocks_per_token
    shape = (n, PAGE, hkv, 2 * D) if strided else (n, hkv, PAGE, 2 * D)
    bits = torch.randint(-100, 100, shape, generator=gen, device=DEVICE, dtype=torch.int8)
    base = bits.masked_fill_(bits == -1, 0).view(torch.float8_e4m3fn)  # 0xFF is e4m3fn's NaN
    cache = base.permute(0, 2, 1, 3) if strided else base
    pick = torch.rand(num_tokens, hkv, blocks_per_token, generator=gen, device=DEVICE).argsort(-1)[..., :TOPK]
    pages = (pick + torch.arange(num_tokens, device=DEVICE)[:, None, None] * blocks_per_token).to(torch.int32)
    return cache, pages.contiguous()


def _time_variants(num_tokens, hkv, strided, calls, label, variants):
    """Per-call time of each (name, make) in `variants` over two fresh input sets; make(cache, pages)
    returns the launch closure. A variant that fails to compile is reported and skipped."""
    sets = [pool(num_tokens, hkv, 64, strided, seed) for seed in range(2)]
    nbytes = num_tokens * hkv * TOPK * PAGE * 2 * D
    rows = []
    for name, make in variants:
        try:
            fns = [make(*sets[i % 2]) for i in range(2)]
            timing = graph_time([fns[i % 2] for i in range(calls)], replays=20)
        except Exception as exc:  # a variant that does not compile is reported, not fatal
            print(f"{label:28s} {name:40s} ERROR {type(exc).__name__}: {str(exc)[:150]}", flush=True)
            continue
        rows.append(dict(case=label, kernel=name, time_us=timing.median_us, bytes=nbytes))
    del sets
    torch.cuda.empty_cache()
    return rows


def _split_counts(hkv):
    return (1,) if hkv > 1 else (2, 4)  # TP1's 512 items fill the GPU; TP4's 128 need splits


def xor_rows(num_tokens, hkv, strided, calls, label):
    """The xor consumer (_stream_xor) through TMA boxes and through pipelined pointer loads of whole
    rows or of K and V halves."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def variant(loads, bn, warps, stages, splits):  # loads: "tma", "plain" (whole rows), "halves"
        items = num_tokens * hkv * splits
        out = torch.empty(items * D // 2, dtype=torch.int32, device=DEVICE)

        def make(cache, pages):
            as_int = _int32_view(cache)
            desc = TensorDescriptor(as_int, list(as_int.shape), list(as_int.stride()), [1, 1, bn, D // 4])
            return lambda: _stream_xor[(items,)](desc, as_int, pages, out, num_tokens, as_int.stride(0),
                                                 as_int.stride(1), as_int.stride(2), HKV=hkv, SPLITS=splits,
                                                 HEAD_FAST=0, WORDS=D // 4, BLOCK_N=bn, NPAGES=TOPK,
                                                 USE_TMA=loads == "tma", HALVES=loads == "halves",
                                                 num_warps=warps, num_stages=stages)
        return f"xor {loads} bn{bn} w{warps} st{stages} sp{splits}", make

    grid = itertools.product(("tma", "plain", "halves"), (64, 128), (2, 4, 8), (2, 3, 4), _split_counts(hkv))
    return _time_variants(num_tokens, hkv, strided, calls, label, [variant(*v) for v in grid])


def _int32_view(cache):
    """The fp8 cache [pages, Hkv, 128, 2D] (either layout) as int32 words [pages, Hkv, 128, 2D / 4]."""
    token_major = cache.stride(1) < cache.stride(2)
    base = cache.permute(0, 2, 1, 3) if token_major else cache  # contiguous in both layouts (pool)
    words = base.view(torch.int32)
    return words.permute(0, 2, 1, 3) if token_major else words


def stream_rows(num_tokens, hkv, strided, calls, label):
    """The summing consumers (_stream_tma, _stream_ptr)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def variant(kind, bn, warps, stages, splits, head_fast):
        items = num_tokens * hkv * splits
        out = torch.empty(items * 2 * D, device=DEVICE)

        def make(cache, pages):
            if kind == "tma":
                desc = TensorDescriptor(cache, list(cache.shape), list(cache.stride()), [1, 1, bn, D])
                return lambda: _stream_tma[(items,)](desc, pages, out, num_tokens, HKV=hkv, SPLITS=splits,
                                                     HEAD_FAST=head_fast, HEAD_DIM=D, BLOCK_N=bn, NPAGES=TOPK,
                                                     num_warps=warps, num_stages=stages)
            return lambda: _stream_ptr[(items,)](cache, pages, out, num_tokens, cache.stride(0), cache.stride(1),
                                                 cache.stride(2), HKV=hkv, SPLITS=splits, HEAD_FAST=head_fast,
                                                 HEAD_DIM=D, BLOCK_N=bn, NPAGES=TOPK, PREFETCH=kind == "prefetch",
                                                 num_warps=warps, num_stages=stages)
        return f"{kind} bn{bn} w{warps} st{stages} sp{splits}{' headfast' if head_fast else ''}", make

    splits = _split_counts(hkv)
    head_orders = (0, 1) if strided else (0,)
    grid = [("tma", *v) for v in itertools.product((64, 128), (2, 4), (2, 3, 4), splits, head_orders)]
    grid += [("plain", 64, w, st, sp, 0) for w, st, sp in itertools.product((4, 8), (2, 3, 4), splits)]
    grid += [("prefetch", bn, w, 1, sp, 0) for bn, w, sp in itertools.product((32, 64, 128), (4, 8), splits)]
    return _time_variants(num_tokens, hkv, strided, calls, label, [variant(*v) for v in grid])


def kernel_rows(layout, num_kv_heads, num_q_heads, batch, calls, configs):
    """The shipped decode split kernel (launched directly, scalar scales) on both cache layouts."""
    rows = []
    module = load_module("sm90", "decode_split", "scalar")
    for strided in (True, False):
        made = [cases.decode_case(arch="sm90", seq_lens=[8192] * batch, num_q_heads=num_q_heads,
                                  num_kv_heads=num_kv_heads, q_dtype=torch.bfloat16, device=DEVICE, seed=s,
                                  strided=strided, compact=True) for s in range(4)]
        nbytes = batch * num_kv_heads * TOPK * PAGE * 2 * D
        for config in configs:
            def one(case):
                a = dict(case.args)
                counters = arrival_counters(torch.device(DEVICE), a["q"].shape[0] * num_kv_heads, key="probe")
                return lambda: module.launch(a["q"], a["kv_cache"], a["topk_idx"], a["block_table"], a["seq_lens"],
                                             num_kv_heads, a["sm_scale"], a["output"], 1, a["k_scale"], a["v_scale"],
                                             None, None, config, DEVICE == "cuda", counters)
            fns = [one(c) for c in made]
            timing = graph_time([fns[i % len(fns)] for i in range(calls)], replays=20)
            case = made[0]
            case.poison()
            fns[0]()
            ref = reference_decode(**dict(case.args, output=None), dtype=torch.float32)
            err = compare(case.args["output"], ref, torch.bfloat16).rel_l2
            label = f"decode {layout} b{batch} {'strided' if strided else 'contiguous'}"
            rows.append(dict(case=label, kernel=f"decode {config_label('sm90', 'decode', config)} sp{config.num_splits}",
                             time_us=timing.median_us, bytes=nbytes, rel_l2=err))
        del made
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--skip-stream", action="store_true")
    parser.add_argument("--xor-only", action="store_true", help="only the xor-consumer stream rows")
    args = parser.parse_args(argv)
    copy = copy_bandwidth()
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), command=" ".join(sys.argv), copy_bytes_per_s=copy)
    print(f"# {env['gpu']}, torch {env['torch']}, triton {env['triton']}; copy {copy / 1e12:.2f} TB/s", flush=True)
    rows = []
    if args.xor_only:
        plan = [("xor tp1 b128", lambda: xor_rows(128, 4, True, args.calls, "xor tp1 b128 strided")),
                ("xor tp4 b128", lambda: xor_rows(128, 1, False, args.calls, "xor tp4 b128"))]
    else:
        tp1 = [LaunchConfig(block_n=64, num_warps=2, num_stages=3, num_splits=1, kv_upcast=2),
               LaunchConfig(block_n=64, num_warps=4, num_stages=3, num_splits=1, kv_upcast=2),
               LaunchConfig(block_n=128, num_warps=4, num_stages=3, num_splits=2, fused_merge=1, kv_upcast=2)]
        plan = [("tp1 b128", lambda: kernel_rows("tp1", 4, 64, 128, args.calls, tp1))]
        if not args.skip_stream:
            for label in ("stream tp1 b128 strided", "stream tp1 b128 contiguous"):
                plan.append((label, lambda label=label: stream_rows(128, 4, label.endswith("strided"), args.calls,
                                                                      label)))
            plan.append(("stream tp4 b128", lambda: stream_rows(128, 1, False, args.calls, "stream tp4 b128")))
    for name, fn in plan:
        got = fn()
        for row in got:
            row["hbm_fraction"] = row["bytes"] / (row["time_us"] * 1e-6) / copy
        best = sorted(got, key=lambda r: r["time_us"])
        for row in (best if name.startswith("tp") else best[:8] + best[-2:]):
            print(f"{row['case']:28s} {row['kernel']:44s} {row['time_us']:8.2f} us {100 * row['hbm_fraction']:5.1f}%"
                  + (f" rel_l2 {row['rel_l2']:.1e}" if "rel_l2" in row else ""), flush=True)
        rows += got
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "stream_probe.json").write_text(json.dumps(dict(env=env, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
