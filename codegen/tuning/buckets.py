"""What one tuning study is about: a kernel on one arch and device at one call shape."""
from __future__ import annotations

import dataclasses

from ..shapes import HEAD_LAYOUTS, KV_DTYPES
from ..variants import PAGE_SIZE, SCALE_MODES
from .argparsing import items

# Prefill's two launch paths, each with its own study per bucket: multi-token tiles (block_t >= 1,
# timed on correlated selections, where neighbouring tokens share blocks) and the per-token path
# (block_t 1, timed on unrelated selections), which selection="auto" takes when tiles would not share.
PATHS = ("tiled", "per_token")
# Earlier blocks per top-k pick that a per-token bucket's prefix gives every query token (see
# unrelated_prefix).
_BLOCKS_PER_PICK = 4


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
    path: str = "tiled"  # prefill: "tiled" or "per_token" (PATHS); decode: always "tiled"

    @property
    def table_key(self) -> str:
        from ..tuned_store import table_key

        return table_key(self.kernel, self.scale_mode, self.kv_dtype, self.num_q_heads, self.num_kv_heads)

    @property
    def per_token(self) -> bool:
        return self.path == "per_token"

    @property
    def label(self) -> str:
        """table@tokens, with ":per_token" for the per-token path (the tiled label is unchanged, so
        the study names of earlier runs still resume)."""
        return f"{self.table_key}@{self.tokens}" + (":per_token" if self.per_token else "")

    def study_name(self, inputs_sha256: str, triton_version: str) -> str:
        """One study per bucket (path included, through the label), kernel sources and Triton: a
        changed template starts afresh."""
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


def parse_label(label: str) -> tuple[str, int, str]:
    """Bucket.label back into (table key, tokens, path); tokens -1 when it is not one."""
    rest, _, path = label.partition(":")
    table, _, tokens = rest.rpartition("@")
    return (table or rest), (int(tokens) if tokens.isdigit() else -1), (path or "tiled")


def parse_modes(text: str) -> list[tuple[str, str]]:
    """'scalar:fp8,none:bf16' -> [("scalar", "fp8"), ("none", "bf16")]."""
    pairs = []
    for item in items("--modes", text):
        mode, _, kv = item.partition(":")
        if mode not in SCALE_MODES or kv not in KV_DTYPES:
            raise ValueError(f"--modes: expected items MODE:KV_DTYPE with MODE in {SCALE_MODES} and KV_DTYPE in "
                             f"{KV_DTYPES}, got {item!r}")
        if mode != "none" and kv != "fp8":
            raise ValueError(f"--modes: scale mode {mode!r} needs an fp8 cache, got {item!r}")
        pairs.append((mode, kv))
    return pairs


def parse_ints(text: str, what: str) -> list[int]:
    listed = items(what, text)
    try:
        values = [int(x) for x in listed]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise ValueError(f"{what}: expected positive integers, got {text!r}")
    return values


def parse_paths(text: str) -> list[str]:
    """'tiled,per_token' -> ["tiled", "per_token"] (--prefill-paths)."""
    paths = items("--prefill-paths", text)
    if any(p not in PATHS for p in paths):
        raise ValueError(f"--prefill-paths: expected a comma list of {', '.join(PATHS)}; got {text!r}")
    return paths


def unrelated_prefix(prefix: int, topk: int) -> int:
    """The cached prefix of a per-token bucket: at least `_BLOCKS_PER_PICK` earlier blocks per pick.
    The random pattern picks each token's earlier blocks uniformly among those before it, so with
    B >= 4 * topk of them two neighbouring tokens share under a quarter of their picks; with a short
    prefix the chunk's first tokens have fewer earlier blocks than topk and all take the same ones,
    which is the case tiles are for, not the one the per-token path serves."""
    return max(prefix, _BLOCKS_PER_PICK * topk * PAGE_SIZE)


def grid(*, arch: str, device: str, kernels, modes, layouts, decode_buckets, prefill_buckets,
         decode_context: int, prefill_prefix: int, pattern: str, prefill_paths=("tiled",),
         topk: int = 16) -> list[Bucket]:
    """Buckets in a coarse-to-fine order: every table gets its ends and middle before the rest, so
    a run stopped by its time budget still covers every table; at each step the per-token buckets
    (`prefill_paths`) follow the tiled ones, so it covers both paths of every prefill table too."""
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
                    if kernel == "decode":
                        buckets.append((rank, 0, Bucket(kernel, arch, device, mode, kv, hq, hkv, tokens,
                                                        decode_context, pattern, topk=topk)))
                        continue
                    for path in prefill_paths:
                        buckets.append((rank, PATHS.index(path),
                                        _prefill_bucket(arch, device, mode, kv, hq, hkv, tokens, prefill_prefix,
                                                        pattern, topk, path)))
    buckets.sort(key=lambda rpb: rpb[:2])
    return [b for *_, b in buckets]


def _prefill_bucket(arch, device, mode, kv, hq, hkv, tokens, prefix, pattern, topk, path) -> Bucket:
    """A tiled bucket times the run's pattern and prefix; a per-token one unrelated selections."""
    if path == "per_token":
        prefix, pattern = unrelated_prefix(prefix, topk), "random"
    return Bucket("prefill", arch, device, mode, kv, hq, hkv, tokens, prefix, pattern, topk=topk, path=path)


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
