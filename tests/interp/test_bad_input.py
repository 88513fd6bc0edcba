"""Bad input: a clear ValueError/TypeError naming the argument, raised before any launch."""
import dataclasses
import re

import pytest
import torch

from codegen import LaunchConfig, cases, sparse_attn_decode, sparse_attn_prefill


def _prefill(**change):
    case = cases.prefill_case(arch="sm90", q_lens=[2], prefix_lens=[130], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, topk=4, scale_mode="scalar")
    case.poison()
    return case, dict(case.args, **change)


def _decode(**change):
    case = cases.decode_case(arch="sm90", seq_lens=[300, 40], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="scalar")
    case.poison()
    return case, dict(case.args, **change)


def _raises(fn, args, exc, pattern, **kw):
    case_output = args["output"]
    poisoned = case_output.clone()
    with pytest.raises(exc, match=pattern):
        fn(**args, **kw)
    assert torch.equal(case_output.isnan(), poisoned.isnan()), "nothing may be launched before the error"


def test_wrong_q_dtype():
    case, args = _prefill(q=torch.ones(2, 8, 32, dtype=torch.int32))
    _raises(sparse_attn_prefill, args, TypeError, r"^q: expected dtype", arch="sm90")


def test_wrong_kv_cache_shape():
    case, args = _prefill()
    args["kv_cache"] = args["kv_cache"][:, :, :64]
    _raises(sparse_attn_prefill, args, ValueError, r"^kv_cache: expected shape .*128", arch="sm90")


def test_wrong_device():
    case, args = _prefill()
    args["block_table"] = torch.empty(args["block_table"].shape, dtype=torch.int32, device="meta")
    _raises(sparse_attn_prefill, args, ValueError, r"^block_table: expected a tensor on cpu", arch="sm90")


def test_head_counts_not_divisible():
    case, args = _prefill(num_kv_heads=3)
    _raises(sparse_attn_prefill, args, ValueError, r"^num_kv_heads: must divide the 8 query heads", arch="sm90")


@pytest.mark.parametrize("missing", ["k_scale", "v_scale"])
def test_only_one_scale(missing):
    case, args = _decode(**{missing: None})
    _raises(sparse_attn_decode, args, ValueError, rf"^{missing}: required when", arch="sm90")


def test_scale_shape_outside_modes():
    case, args = _decode()
    args["k_scale"] = torch.ones(2, 5)
    _raises(sparse_attn_decode, args, ValueError, r"^k_scale: expected one element \(scalar mode\) or shape \(2, >=\d+\)", arch="sm90")


def test_scale_dtype():
    case, args = _decode()
    args["v_scale"] = args["v_scale"].double()
    _raises(sparse_attn_decode, args, TypeError, r"^v_scale: expected dtype torch.float32", arch="sm90")


def test_scales_on_bf16_cache():
    case, args = _decode()
    args["kv_cache"] = args["kv_cache"].to(torch.bfloat16)
    _raises(sparse_attn_decode, args, ValueError, r"only an fp8 kv_cache takes scales", arch="sm90")


@pytest.mark.parametrize("arch,wrong", [("sm90", torch.float8_e4m3fnuz), ("gfx942", torch.float8_e4m3fn)])
def test_fp8_type_the_arch_cannot_run(arch, wrong):
    case, args = _prefill()
    args["kv_cache"] = args["kv_cache"].to(torch.float32).to(wrong)
    _raises(sparse_attn_prefill, args, TypeError, rf"^kv_cache: {re.escape(str(wrong))} cannot run on {arch}", arch=arch)


def test_unknown_arch():
    case, args = _prefill()
    _raises(sparse_attn_prefill, args, ValueError, r"^arch: expected one of \['gfx942', 'sm90'\]", arch="sm100")


def test_arch_required_on_cpu():
    case, args = _prefill()
    _raises(sparse_attn_prefill, args, ValueError, r"^arch: required for CPU tensors")


def test_unknown_config_key():
    case, args = _prefill()
    _raises(sparse_attn_prefill, args, ValueError, r"^config: unknown key\(s\) \['blok_n'\]", arch="sm90",
            config={"blok_n": 64})


@pytest.mark.parametrize("config,pattern", [
    (LaunchConfig(block_n=48), r"^config.block_n: expected a power of two"),
    (LaunchConfig(waves_per_eu=2), r"^config.waves_per_eu: an AMD \(gfx942\) launch option, not available on sm90"),
    (LaunchConfig(num_warps=3), r"^config.num_warps: expected a power of two"),
])
def test_bad_config_values(config, pattern):
    case, args = _prefill()
    _raises(sparse_attn_prefill, args, ValueError, pattern, arch="sm90", config=config)


def test_num_splits_larger_than_topk():
    case, args = _decode()
    _raises(sparse_attn_decode, args, ValueError, r"^config.num_splits: expected \[1, topk=4\]", arch="sm90",
            config=LaunchConfig(num_splits=5))


def test_config_value_type():
    case, args = _decode()
    _raises(sparse_attn_decode, args, TypeError, r"^config.num_splits: expected an int", arch="sm90",
            config={"num_splits": 2.0})


def test_varlen_needs_both_tensors():
    case, args = _decode(query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32))
    _raises(sparse_attn_decode, args, ValueError, r"^token_to_req_indices: required when query_start_loc", arch="sm90")


def test_wrong_output_dtype():
    case, args = _decode()
    args["output"] = torch.full(args["output"].shape, float("nan"), dtype=torch.float64)
    _raises(sparse_attn_decode, args, TypeError, r"^output: expected dtype", arch="sm90")


def test_topk_idx_int64():
    case, args = _prefill()
    args["topk_idx"] = args["topk_idx"].long()
    _raises(sparse_attn_prefill, args, TypeError, r"^topk_idx: expected dtype", arch="sm90")


def test_metadata_length_mismatch():
    case, args = _prefill()
    args["prefix_lens"] = torch.zeros(3, dtype=torch.int32)
    _raises(sparse_attn_prefill, args, ValueError, r"^prefix_lens: expected shape \(1,\)", arch="sm90")


def test_sm_scale_must_be_positive():
    case, args = _prefill(sm_scale=0.0)
    _raises(sparse_attn_prefill, args, ValueError, r"^sm_scale: expected a finite float > 0", arch="sm90")


def test_too_few_query_rows_for_uniform_decode():
    case, args = _decode(decode_query_len=4)
    _raises(sparse_attn_decode, args, ValueError, r"^q: expected at least num_reqs \* decode_query_len", arch="sm90")


def test_unfolded_baseline_is_scalar_only():
    case = cases.decode_case(arch="sm90", seq_lens=[300], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="per_token_head")
    case.poison()
    _raises(sparse_attn_decode, case.args, ValueError, r"^fold_scales: False .* scalar scales only", arch="sm90",
            fold_scales=False)


def test_interpreter_versions_that_cannot_run_say_what_is_needed():
    from codegen.validate import check_interpreter_versions

    with pytest.raises(RuntimeError, match=r"triton 3.6.0's interpreter needs numpy < 2.4, found numpy 2.4.6"):
        check_interpreter_versions("3.6.0", "2.4.6")
    check_interpreter_versions("3.6.0", "2.3.5")  # checked to run
    check_interpreter_versions("3.9.0", "2.4.6")  # CI's pins


def test_num_kv_heads_against_the_cache_names_both():
    # Hq 8 is divisible by 4, so the only fault is the 2-head cache against num_kv_heads=4.
    case, args = _prefill(num_kv_heads=4)
    _raises(sparse_attn_prefill, args, ValueError,
            r"^num_kv_heads: 4 does not match kv_cache, which holds 2 KV heads \(dim 1 of", arch="sm90")


@pytest.mark.parametrize("fields, message", [
    (dict(num_warps=True), "config.num_warps: expected an int, got True"),
    (dict(block_n=64.0), "config.block_n: expected an int, got 64.0"),
    (dict(kv_tma="1"), "config.kv_tma: expected an int, got '1'"),
])
def test_a_launch_config_object_gets_the_type_checks_a_dict_gets(fields, message):
    """Built by hand or from a dict, a config is refused the same way, naming the field."""
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        LaunchConfig(**fields)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        LaunchConfig.from_dict(fields)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):  # replace() builds a new object too
        dataclasses.replace(LaunchConfig(), **fields)
