"""One test per input check of codegen/validate.py that tests/interp/test_bad_input.py does not
reach (issue 39): each asserts the error type, that the message starts with the argument's name,
and that no kernel was launched (the `launches` spy of conftest.py, on the generated modules'
launch(), so a launch that wrote only partials or counters is seen too).

The device and arch checks need a GPU's answers: they are called directly with the CUDA queries
faked (no kernel can run there anyway)."""
import types

import pytest
import torch

from codegen import cases, sparse_attn_decode, sparse_attn_prefill, validate


def _prefill(**change):
    case = cases.prefill_case(arch="sm90", q_lens=[2], prefix_lens=[130], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, topk=4, scale_mode="scalar")
    case.poison()
    return dict(case.args, **change)


def _decode(**change):
    case = cases.decode_case(arch="sm90", seq_lens=[300, 40], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4,
                             scale_mode="scalar")
    case.poison()
    return dict(case.args, **change)


def _refused(launches, fn, args, exc, pattern, arch="sm90"):
    with pytest.raises(exc, match=pattern):
        fn(**args, arch=arch)
    assert launches == [], f"launched before the error: {launches}"


def test_the_spy_sees_the_launches_of_a_good_call(launches):
    """The control: without it an empty spy would prove nothing."""
    sparse_attn_decode(**_decode(), arch="sm90")
    assert launches and all(name.startswith("sm90_decode_") for name in launches), launches


def test_a_tensor_argument_that_is_not_a_tensor(launches):
    args = _prefill()
    args["q"] = args["q"].tolist()
    _refused(launches, sparse_attn_prefill, args, TypeError, r"^q: expected a torch.Tensor")


@pytest.mark.parametrize("fn, make, name, change, dims", [
    (sparse_attn_prefill, _prefill, "topk_idx", lambda t: t[0], 3),
    (sparse_attn_prefill, _prefill, "kv_cache", lambda t: t[0], 4),
    (sparse_attn_prefill, _prefill, "seq_lens", lambda t: t[None], 1),
    (sparse_attn_decode, _decode, "block_table", lambda t: t[0], 2),
])
def test_a_tensor_with_the_wrong_number_of_dimensions(launches, fn, make, name, change, dims):
    args = make()
    args[name] = change(args[name])
    _refused(launches, fn, args, ValueError, rf"^{name}: expected a {dims}-D tensor")


@pytest.mark.parametrize("change", [
    lambda t: t[:1],  # one KV head of two
    lambda t: t[:, :1],  # one token of two
    lambda t: t[:, :, :0],  # topk 0
])
def test_topk_idx_of_the_wrong_shape(launches, change):
    args = _prefill()
    args["topk_idx"] = change(args["topk_idx"])
    _refused(launches, sparse_attn_prefill, args, ValueError,
             r"^topk_idx: expected shape \(2, 2, topk>=1\) \[num_kv_heads, total_q, topk\]")


@pytest.mark.parametrize("head_dim", [24, 8])  # not a power of two; a power of two below 16
def test_a_head_dim_the_kernels_cannot_take(launches, head_dim):
    args = _prefill()
    args["q"] = torch.randn(2, 8, head_dim)
    args["output"] = torch.full_like(args["q"], float("nan"))
    _refused(launches, sparse_attn_prefill, args, ValueError,
             rf"^q: expected head_dim a power of two >= 16, got {head_dim}")


def test_a_kv_cache_dtype_no_kernel_reads(launches):
    args = _decode(k_scale=None, v_scale=None)
    args["kv_cache"] = args["kv_cache"].to(torch.float32)
    _refused(launches, sparse_attn_decode, args, TypeError, r"^kv_cache: expected dtype in \[.*\] on sm90, got torch.float32")


@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
def test_a_scale_given_as_a_python_float(launches, name):
    _refused(launches, sparse_attn_decode, _decode(**{name: 0.7}), TypeError,
             rf"^{name}: expected a float32 torch.Tensor, got float")


def test_a_scale_on_another_device(launches):
    args = _decode()
    args["v_scale"] = torch.empty(1, device="meta")
    _refused(launches, sparse_attn_decode, args, ValueError, r"^v_scale: expected a tensor on cpu .*, got meta")


def test_scalar_k_scale_with_per_token_v_scale(launches):
    args = _decode()
    args["v_scale"] = torch.ones(2, args["kv_cache"].shape[0] * 128)
    _refused(launches, sparse_attn_decode, args, ValueError,
             r"^k_scale/v_scale: must be the same mode, got k_scale scalar and v_scale per_token_head")


@pytest.mark.parametrize("fn, make, name, value, least", [
    (sparse_attn_prefill, _prefill, "num_kv_heads", 0, 1),
    (sparse_attn_decode, _decode, "num_kv_heads", -2, 1),
    (sparse_attn_prefill, _prefill, "max_query_len", -1, 0),
    (sparse_attn_decode, _decode, "decode_query_len", 0, 1),
])
def test_a_count_below_its_minimum(launches, fn, make, name, value, least):
    _refused(launches, fn, make(**{name: value}), ValueError, rf"^{name}: expected an int >= {least}, got {value}")


@pytest.mark.parametrize("fn, make, name, value", [
    (sparse_attn_prefill, _prefill, "num_kv_heads", 2.0),
    (sparse_attn_prefill, _prefill, "max_query_len", True),  # bool is an int to Python, not to the API
    (sparse_attn_decode, _decode, "decode_query_len", "1"),
])
def test_a_count_that_is_not_an_int(launches, fn, make, name, value):
    _refused(launches, fn, make(**{name: value}), TypeError, rf"^{name}: expected an int, got {type(value).__name__}")


@pytest.mark.parametrize("value", ["0.17", True, None])
def test_an_sm_scale_of_the_wrong_type(launches, value):
    _refused(launches, sparse_attn_prefill, _prefill(sm_scale=value), TypeError,
             rf"^sm_scale: expected a float, got {type(value).__name__}")


def test_cpu_tensors_without_the_interpreter(launches, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    _refused(launches, sparse_attn_decode, _decode(), ValueError,
             r"^q: CPU tensors run only under the Triton interpreter; set TRITON_INTERPRET=1")


def test_tensors_on_a_device_without_kernels(launches):
    args = {name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in _prefill().items()}
    _refused(launches, sparse_attn_prefill, args, ValueError, r"^q: expected a CUDA/ROCm or CPU tensor, got device meta")


@pytest.fixture
def gpu(monkeypatch):
    """The CUDA queries detect_device_arch makes, answered as `props` and `hip` say."""
    def fake(hip=None, **props):
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(**props))
    return fake


CUDA = torch.device("cuda", 0)


def test_the_arch_is_read_off_the_gpu(gpu):
    gpu(major=9, minor=0)
    assert validate.resolve_arch(None, CUDA) == validate.resolve_arch("sm90", CUDA) == "sm90"
    gpu(hip="6.2", gcnArchName="gfx942:sramecc+:xnack-")
    assert validate.resolve_arch(None, CUDA) == "gfx942"


def test_an_arch_that_is_not_the_gpu_s(gpu):
    gpu(major=9, minor=0)
    with pytest.raises(ValueError, match=r"^arch: 'gfx942' does not match the device cuda:0 \('sm90'\)"):
        validate.resolve_arch("gfx942", CUDA)


@pytest.mark.parametrize("hip, props, pattern", [
    (None, dict(major=8, minor=0), r"^arch: no generated kernels for compute capability 8.0 \(have sm90\)"),
    (None, dict(major=10, minor=0), r"^arch: no generated kernels for compute capability 10.0"),
    ("6.2", dict(gcnArchName="gfx90a:sramecc+:xnack-"), r"^arch: no generated kernels for 'gfx90a' \(have \["),
])
def test_a_gpu_without_generated_kernels(gpu, hip, props, pattern):
    gpu(hip=hip, **props)
    with pytest.raises(ValueError, match=pattern):
        validate.resolve_arch(None, CUDA)
