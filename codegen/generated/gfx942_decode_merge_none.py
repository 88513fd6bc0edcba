# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.
# template: templates/decode_merge.py.jinja (with templates/_merge.jinja)
# variant: gfx942_decode_merge_none (arch=gfx942, kernel=decode_merge, scale_mode=none)
# inputs-sha256: ff232b9c48042d1b3f43a360fa1b98687e25288a94a2d34bfdee3e0b3d69f228
"""MSA sparse-attention decode, merge of the split-K partials, gfx942, KV scale mode `none`.

One program = one query token x one KV head: reduces the NUM_SPLITS normalized partials of the
group's query heads by their base-2 log-sum-exp. Rows whose splits saw no key come out as zeros.
The partials are read as the split kernel's launch allocated them (fp16 or fp32, its
partial_dtype) and merged in fp32.
"""
import torch
import triton
import triton.language as tl

ARCH = "gfx942"
SCALE_MODE = "none"


@triton.jit
def _msa_decode_merge_kernel(
    # tensors
    part_o_ptr, part_lse_ptr, out_ptr,
    # strides
    stride_o_t, stride_o_h, stride_o_d,
    # shapes and launch parameters
    GQA: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr, MERGE_CHUNK: tl.constexpr, USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = tl.arange(0, SPLITS_P2)
    heads = g * GQA + offs_m
    row_ok = offs_m < GQA
    row = (t * (tl.num_programs(1) * GQA) + heads) * NUM_SPLITS  # first split of each row
    mg_lse = tl.load(
        part_lse_ptr + row[:, None] + offs_s[None, :],
        mask=row_ok[:, None] & (offs_s[None, :] < NUM_SPLITS),
        other=float("-inf"),
    )
    mg_max = tl.max(mg_lse, axis=1)
    mg_shift = tl.where(mg_max == float("-inf"), 0.0, mg_max)
    mg_den = tl.sum(tl.exp2(mg_lse - mg_shift[:, None]), axis=1)  # an empty split has lse -inf: weight 0
    mg_acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # MERGE_CHUNK splits' partials per load, all in flight at once: the merge costs a few L2 round
    # trips, not one per split.
    for c in tl.static_range(0, SPLITS_P2, MERGE_CHUNK):
        offs_c = c + tl.arange(0, MERGE_CHUNK)
        mg_ok = row_ok[:, None] & (offs_c[None, :] < NUM_SPLITS)
        mg_w = tl.exp2(tl.load(part_lse_ptr + row[:, None] + offs_c[None, :], mask=mg_ok,
                               other=float("-inf")) - mg_shift[:, None])
        mg_o = tl.load(part_o_ptr + (row[:, None, None] + offs_c[None, :, None]) * HEAD_DIM + offs_d[None, None, :],
                       mask=mg_ok[:, :, None], other=0.0).to(tl.float32)  # fp16 or fp32 partials
        mg_acc += tl.sum(mg_w[:, :, None] * mg_o, axis=1)
    o = mg_acc / tl.where(mg_den > 0.0, mg_den, 1.0)[:, None]
    tl.store(
        out_ptr + t * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


KERNEL = _msa_decode_merge_kernel


def constexprs(*, num_q_heads, num_kv_heads, head_dim, config, use_pdl=False, **_):
    """The kernel's compile-time parameters for a shape and config (shared with the static checks)."""
    gqa = num_q_heads // num_kv_heads
    return dict(GQA=gqa, HEAD_DIM=head_dim, BLOCK_M=triton.next_power_of_2(gqa), NUM_SPLITS=config.num_splits,
                SPLITS_P2=triton.next_power_of_2(config.num_splits),
                MERGE_CHUNK=min(4, triton.next_power_of_2(config.num_splits)), USE_PDL=False)


def options(config):
    """Launch options of the merge kernel: its own warp count, one stage (no loop to pipeline)."""
    return dict(num_warps=config.merge_num_warps, num_stages=1)


def launch(part_o, part_lse, output, num_kv_heads, v_scale, config, use_pdl, record=None):
    """Reduces the split kernel's partials into `output` (validated by codegen.api). `record`: a
    list that receives the launch as (kernel, grid, args, kwargs) instead of running it."""
    total_q, num_q_heads, num_splits, head_dim = part_o.shape
    grid = (total_q, num_kv_heads)
    args = (
        part_o, part_lse, output,
        *output.stride(),
    )
    kwargs = dict(**constexprs(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, config=config,
                               use_pdl=use_pdl),
                  **options(config))
    if record is not None:
        record.append((_msa_decode_merge_kernel, grid, args, kwargs))
    else:
        _msa_decode_merge_kernel[grid](*args, **kwargs)
    return output

INPUTS_SHA256 = 'ff232b9c48042d1b3f43a360fa1b98687e25288a94a2d34bfdee3e0b3d69f228'
