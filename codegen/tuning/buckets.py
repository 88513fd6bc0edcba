"""What one tuning study is about: a kernel on one arch and device at one call shape."""
from __future__ import annotations

import dataclasses

from ..shapes import HEAD_LAYOUTS, KV_DTYPES
from ..variants import SCALE_MODES


@dataclasses.dataclass(frozen=True)
class Bucket:
    kernel: str  # "prefill" | "decode"
    arch: str
    device: str  # normalized device name
    scale_mode: str
    kv_dtype: str
    num_q_heads: int
    num_kv_heads: int
    tokens: int  # decode: requests (query length 1); prefill: chunk tokens of one request
    context: int  # decode: tokens per request already cached; prefill: cached prefix
    pattern: str = "correlated"  # prefill selection pattern the timing inputs use
    head_dim: int = 128
    topk: int = 16

    @property
    def table_key(self) -> str:
        from ..tuned_store import table_key

        return table_key(self.kernel, self.scale_mode, self.kv_dtype, self.num_q_heads, self.num_kv_heads)

    @property
    def label(self) -> str:
        return f"{self.table_key}@{self.tokens}"

    def study_name(self, inputs_sha256: str, triton_version: str) -> str:
        """One study per bucket, kernel sources and Triton: a changed template starts afresh."""
        return (f"{self.arch}:{self.device}:{self.label}:ctx{self.context}:{self.pattern}:"
                f"{inputs_sha256}:triton{triton_version}")

    def build_case(self, *, seed: int, device: str, q_dtype):
        """Inputs like real serving for this bucket: decode `tokens` requests of one query token,
        or one prefill chunk of `tokens` tokens."""
        from .. import cases

        batch, tokens = (self.tokens, 1) if self.kernel == "decode" else (1, self.tokens)
        return cases.serving_case(self.kernel, arch=self.arch, num_q_heads=self.num_q_heads,
                                  num_kv_heads=self.num_kv_heads, kv_dtype=self.kv_dtype, scale_mode=self.scale_mode,
                                  batch=batch, tokens=tokens, context=self.context, pattern=self.pattern,
                                  head_dim=self.head_dim, topk=self.topk, q_dtype=q_dtype, device=device, seed=seed)


def parse_modes(text: str) -> list[tuple[str, str]]:
    """'scalar:fp8,none:bf16' -> [("scalar", "fp8"), ("none", "bf16")]."""
    pairs = []
    for item in filter(None, text.split(",")):
        mode, _, kv = item.partition(":")
        if mode not in SCALE_MODES or kv not in KV_DTYPES:
            raise ValueError(f"--modes: expected items MODE:KV_DTYPE with MODE in {SCALE_MODES} and KV_DTYPE in "
                             f"{KV_DTYPES}, got {item!r}")
        if mode != "none" and kv != "fp8":
            raise ValueError(f"--modes: scale mode {mode!r} needs an fp8 cache, got {item!r}")
        pairs.append((mode, kv))
    return pairs


def parse_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what}: expected positive integers, got {text!r}")
    return values


def grid(*, arch: str, device: str, kernels, modes, layouts, decode_buckets, prefill_buckets,
         decode_context: int, prefill_prefix: int, pattern: str) -> list[Bucket]:
    """Buckets in a coarse-to-fine order: every table gets its ends and middle before the rest, so
    a run stopped by its time budget still covers every table."""
    buckets = []
    for kernel in kernels:
        tokens_list = decode_buckets if kernel == "decode" else prefill_buckets
        order = _coarse_to_fine(sorted(tokens_list))
        for rank, tokens in enumerate(order):
            for mode, kv in modes:
                for layout in layouts:
                    if layout not in HEAD_LAYOUTS:
                        raise ValueError(f"--layouts: expected names from {sorted(HEAD_LAYOUTS)}, got {layout!r}")
                    hq, hkv = HEAD_LAYOUTS[layout]
                    context = decode_context if kernel == "decode" else prefill_prefix
                    buckets.append((rank, Bucket(kernel, arch, device, mode, kv, hq, hkv, tokens, context, pattern)))
    buckets.sort(key=lambda rb: rb[0])
    return [b for _, b in buckets]


def _coarse_to_fine(values: list[int]) -> list[int]:
    """Ends first, then repeated midpoints: [1..256] -> 1, 256, 16, 4, 64, 2, 8, 32, 128."""
    if len(values) <= 2:
        return values
    order, spans = [values[0], values[-1]], [(0, len(values) - 1)]
    while spans:
        lo, hi = spans.pop(0)
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        order.append(values[mid])
        spans += [(lo, mid), (mid, hi)]
    return order
