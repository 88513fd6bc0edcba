"""Bad input: a clear ValueError/TypeError naming the argument, raised before any launch."""
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import codegen
from codegen import LaunchConfig, cases, sparse_attn_decode, sparse_attn_prefill
from codegen.configs import validate_config

REPO = pathlib.Path(codegen.__file__).resolve().parent.parent


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


LAUNCHED: list = []  # this test's launches (conftest.py's spy on the generated modules' launch())


@pytest.fixture(autouse=True)
def _spied(launches):
    global LAUNCHED
    LAUNCHED = launches


def _raises(fn, args, exc, pattern, **kw):
    case_output = args["output"]
    poisoned = case_output.clone()
    before = len(LAUNCHED)
    with pytest.raises(exc, match=pattern):
        fn(**args, **kw)
    assert LAUNCHED[before:] == [], "nothing may be launched before the error"
    assert torch.equal(case_output.isnan(), poisoned.isnan()), "nothing may be written before the error"


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
    _raises(sparse_attn_decode, args, ValueError, r"^k_scale/v_scale: only an fp8 kv_cache takes scales", arch="sm90")


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


def test_varlen_still_checks_decode_query_len():
    """query_start_loc gives varlen decode its rows; decode_query_len goes unused, but not unchecked."""
    case, args = _decode()
    varlen = dict(query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
                  token_to_req_indices=torch.tensor([0, 1], dtype=torch.int32))
    for bad, error in (("abc", TypeError), (2.5, TypeError), (True, TypeError), (0, ValueError), (-3, ValueError)):
        _raises(sparse_attn_decode, dict(args, decode_query_len=bad, **varlen), error, r"^decode_query_len: expected",
                arch="sm90")


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


@pytest.mark.parametrize("kernel, fields, message", [
    ("decode", dict(v_early=2), "config.v_early: expected 0 (V loaded after the softmax) or 1 (beside K), got 2"),
    ("decode", dict(v_early=1, num_stages=2), "config.v_early: 1 needs num_stages 1 (with 2 stages the pipeliner "
                                              "loads the next slices' V ahead already), got num_stages 2"),
    ("prefill", dict(v_early=1, num_stages=1), "config.v_early: a decode-only parameter, leave it 0 for prefill"),
])
def test_v_early_is_refused_where_it_does_not_apply(kernel, fields, message):
    """Never silently dropped: with stages the pipeliner's order would win, and prefill has no such branch."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        validate_config(LaunchConfig(**fields), arch="sm90", kernel=kernel)


# --- issue 38: the API's corners on the CPU


@pytest.mark.parametrize("make,fn", [(_prefill, sparse_attn_prefill), (_decode, sparse_attn_decode)])
def test_bf16_queries_are_refused_by_the_interpreter(make, fn):
    """The interpreter's bf16 arithmetic is wrong (decode gave NaN, prefill was off by 8e8)."""
    case, args = make()
    args["q"], args["output"] = args["q"].to(torch.bfloat16), torch.full_like(args["output"], float("nan"),
                                                                              dtype=torch.bfloat16)
    _raises(fn, args, ValueError, r"^q: the Triton interpreter .* computes torch.bfloat16 wrongly; pass fp32 or fp16",
            arch="sm90")


def test_fp16_queries_still_run_on_the_interpreter():
    case = cases.decode_case(arch="sm90", seq_lens=[300], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="scalar", q_dtype=torch.float16)
    case.poison()
    sparse_attn_decode(**case.args, arch="sm90")
    assert not case.output.isnan().any()


def test_triton_interpret_set_after_the_import_says_what_to_do(tmp_path):
    """Triton reads TRITON_INTERPRET when its functions are defined: set later, the call used to fail
    inside the kernel with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    script = tmp_path / "late.py"
    script.write_text(
        "import os\n"
        "from codegen import cases, sparse_attn_decode\n"
        "os.environ['TRITON_INTERPRET'] = '1'  # too late: codegen's import brought Triton in\n"
        "case = cases.decode_case(arch='sm90', seq_lens=[300], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4)\n"
        "case.poison()\n"
        "try:\n"
        "    sparse_attn_decode(**case.args, arch='sm90')\n"
        "except RuntimeError as exc:\n"
        "    assert case.output.isnan().all(), 'nothing may be launched before the error'\n"
        "    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("TRITON_INTERPRET: set to 1 after Triton was imported") and \
        "set TRITON_INTERPRET=1 before importing codegen" in proc.stdout, proc.stdout


def test_a_meta_output_after_a_good_call_of_the_same_shape_is_refused():
    """The plan key holds each tensor's device with its type: get_device() is -1 for CPU and meta."""
    case, args = _decode()
    sparse_attn_decode(**args, arch="sm90")
    args["output"] = torch.empty(args["output"].shape, dtype=args["output"].dtype, device="meta")
    with pytest.raises(ValueError, match=r"^output: expected a tensor on cpu \(the device of q\), got meta"):
        sparse_attn_decode(**args, arch="sm90")


@pytest.mark.parametrize("change, message", [
    (dict(scale_mode="bogus"), "scale_mode: expected one of ['none', 'scalar', 'per_token_head'], got 'bogus'"),
    (dict(kv_dtype="fp32"), "kv_dtype: expected one of ['fp8', 'bf16', 'fp16'], got 'fp32'"),
    (dict(kv_dtype="bf16"), "scale_mode: 'scalar' with a bf16 cache: only an fp8 kv_cache takes scales"),
    (dict(num_q_heads=16, num_kv_heads=3), "num_kv_heads: must divide the 16 query heads (num_q_heads), got 3"),
    (dict(num_kv_heads=0), "num_kv_heads: expected an int >= 1, got 0"),
    (dict(topk=0), "topk: expected an int >= 1, got 0"),
    (dict(num_tokens=-2), "num_tokens: expected an int >= 0, got -2"),
    (dict(num_tokens=2.0), "num_tokens: expected an int, got float"),
])
@pytest.mark.parametrize("device", ["cpu-interpreter", "NVIDIA H200"])  # without and with a tuned table
def test_get_config_checks_its_arguments_as_the_kernels_do(change, message, device):
    from codegen import get_config

    args = dict(dict(kernel="decode", arch="sm90", device_name=device, scale_mode="scalar", kv_dtype="fp8",
                     num_q_heads=16, num_kv_heads=1, num_tokens=2, topk=16), **change)
    with pytest.raises((ValueError, TypeError), match=f"^{re.escape(message)}"):
        get_config(**args)


def test_a_wrong_length_seq_lens_is_named_in_prefill():
    case, args = _prefill(seq_lens=torch.tensor([132, 5], dtype=torch.int32))
    _raises(sparse_attn_prefill, args, ValueError,
            r"^seq_lens: expected shape \(1,\) \[num_reqs\] \(1 request, as cu_seqlens_q, prefix_lens and "
            r"block_table say\), got shape \(2,\)", arch="sm90")


def test_a_block_table_with_a_row_too_many_is_named():
    case, args = _prefill(block_table=torch.zeros(2, 3, dtype=torch.int32))
    _raises(sparse_attn_prefill, args, ValueError,
            r"^block_table: expected 1 rows .* as seq_lens, cu_seqlens_q and prefix_lens say\), got 2 rows", arch="sm90")


def test_decode_seq_lens_against_block_table_names_both():
    """Uniform decode has two per-request arguments: which one is wrong cannot be told."""
    case, args = _decode(seq_lens=torch.tensor([300], dtype=torch.int32))
    _raises(sparse_attn_decode, args, ValueError,
            r"^seq_lens, block_table: disagree on the number of requests \(seq_lens shape \(1,\) \[num_reqs\], "
            r"block_table 2 rows \[num_reqs, max_blocks\]\)", arch="sm90")


def test_varlen_decode_names_the_one_that_disagrees():
    case, args = _decode(query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
                         token_to_req_indices=torch.tensor([0, 1], dtype=torch.int32),
                         seq_lens=torch.tensor([300, 40, 7], dtype=torch.int32))
    _raises(sparse_attn_decode, args, ValueError,
            r"^seq_lens: expected shape \(2,\) \[num_reqs\] \(2 requests, as query_start_loc and block_table say\)",
            arch="sm90")
