"""The plugin's decisions, called directly (no vLLM import): which calls msa-tune serves and in
which scale mode, why the others stay on vLLM's kernel, the switch and the version range, and a
call codegen.api refuses going to vLLM's function."""
import logging

import pytest
import torch

from codegen import vllm_plugin as plugin
from codegen.cases import decode_case

FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def plain_logger(monkeypatch):
    # The plugin logs through vllm.logger; a plain logger keeps vLLM out of this process.
    monkeypatch.setattr(plugin, "_logger", lambda: logging.getLogger(plugin.LOGGER))
    monkeypatch.setattr(plugin, "_said", set())
    monkeypatch.setenv("MSA_TUNE_VLLM_ARCH", "sm90")
    monkeypatch.setattr(plugin, "_arch_of_device", {})


def serve(kv_dtype=FP8, k_scale=None, v_scale=None, q_dtype=torch.float32, head_dim=32):
    q = torch.zeros(3, 8, head_dim, dtype=q_dtype)
    kv = torch.zeros(5, 2, 128, 2 * head_dim).to(kv_dtype)
    return plugin._serve(q, kv, 2, k_scale, v_scale)


def one():
    return torch.ones((), dtype=torch.float32)


def test_served_calls_and_their_scale_mode():
    assert serve()[:2] == ("sm90", "none")
    assert serve(k_scale=one(), v_scale=one())[:2] == ("sm90", "scalar")  # vLLM's 0-d layer scales
    assert serve(k_scale=torch.ones(1), v_scale=torch.ones(1))[1] == "scalar"
    per_token = torch.ones(2, 5 * 128 + 7)
    assert serve(k_scale=per_token, v_scale=per_token)[1] == "per_token_head"
    # vLLM ignores scales on a 16-bit cache; msa-tune would refuse them, so they are dropped.
    assert serve(kv_dtype=torch.bfloat16, k_scale=one(), v_scale=one()) == ("sm90", "none", None, None)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(kv_dtype=torch.float8_e5m2), "KV cache dtype torch.float8_e5m2"),
    (dict(kv_dtype=torch.float8_e4m3fnuz), "KV cache dtype torch.float8_e4m3fnuz"),  # gfx942's, not sm90's
    (dict(q_dtype=torch.float64), "query dtype"),
    (dict(head_dim=48), "head_dim 48"),
    (dict(k_scale=torch.ones(1)), "only one of"),
    (dict(k_scale=torch.ones(1, dtype=torch.float64), v_scale=torch.ones(1, dtype=torch.float64)), "float32"),
    (dict(k_scale=torch.ones(1, 1), v_scale=torch.ones(1, 1)), "shapes (1, 1)"),
    (dict(k_scale=torch.ones(2, 100), v_scale=torch.ones(2, 100)), "num_blocks*128"),  # fewer slots than pages
])
def test_calls_left_to_vllm_say_why(kwargs, reason):
    why = serve(**kwargs)
    assert isinstance(why, str) and reason in why, why


def test_cpu_without_an_arch_is_left_to_vllm(monkeypatch):
    monkeypatch.delenv("MSA_TUNE_VLLM_ARCH")
    assert "MSA_TUNE_VLLM_ARCH" in serve()


@pytest.mark.parametrize("value, want", [
    (None, ("prefill", "decode")), ("1", ("prefill", "decode")), ("decode", ("decode",)),
    ("prefill", ("prefill",)), ("0", str), ("off", str), ("bogus", str),
])
def test_switch(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("MSA_TUNE_VLLM", raising=False)
    else:
        monkeypatch.setenv("MSA_TUNE_VLLM", value)
    got = plugin._kernels_switched_on()
    assert isinstance(got, str) if want is str else got == want


@pytest.mark.parametrize("version, ok", [
    ("0.33.0", True), ("0.33.2+cu130", True), ("0.33.1rc1", True), ("0.32.9", False), ("0.34.0", False),
    ("0.34.0.dev3+g1234", False), ("1.0.0", False), ("dev", False),
])
def test_version_range(version, ok):
    assert (plugin._version_problem(version) is None) == ok


def test_a_call_the_api_refuses_runs_on_vllm_and_is_logged_once(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []

    def vllm_decode(*args, **kwargs):
        calls.append(kwargs)

    wrapper = plugin._decode_wrapper(vllm_decode)
    case = decode_case(arch="sm90", seq_lens=[200], num_q_heads=8, num_kv_heads=2, head_dim=32, topk=4)
    a = case.args
    topk64 = a["topk_idx"].long()  # msa-tune takes int32 ids: codegen.api refuses before any launch
    with caplog.at_level(logging.WARNING, logger=plugin.LOGGER):
        for _ in range(2):
            wrapper(a["q"], a["kv_cache"], topk64, a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"],
                    a["output"], 1, k_scale=a["k_scale"], v_scale=a["v_scale"])
    assert len(calls) == 2 and calls[0]["k_scale"] is a["k_scale"]
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "topk_idx" in refused[0].getMessage(), caplog.text
