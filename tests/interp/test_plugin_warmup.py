"""The vLLM plugin's warm-up (codegen.vllm_plugin._warm_up): once per head layout and cache type,
for exactly that call's layout, mode, query length and block-table width; off with MSA_TUNE_WARMUP=0."""
import logging
import pytest
import torch

from codegen import vllm_plugin, warmup


class _FakeDevice:
    type = "cuda"


ONE_GPU = _FakeDevice()  # one device for every fake q: the warm-up's key holds the device too


class _FakeCuda:
    """What _warm_up reads of q: its device type, shape and dtype."""

    def __init__(self, shape, dtype=torch.bfloat16, device=ONE_GPU):
        self.device = device
        self.shape, self.dtype = shape, dtype


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(warmup, "warmup", lambda **kw: seen.append(kw) or warmup.WarmupReport(3, [], 0.1, 1))
    monkeypatch.setattr(vllm_plugin, "_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(vllm_plugin, "_said", set())
    return seen


def _warm(q, query_len=1, topk=16):
    kv_cache = torch.empty(1, 1, 1, 1, dtype=torch.float8_e4m3fn)
    vllm_plugin._warm_up("sm90", q, kv_cache, 1, "scalar", "fp8", topk, torch.empty(3, 1024), query_len)


def test_once_per_layout_with_the_call_s_shapes(calls):
    q = _FakeCuda((4, 16, 128))
    _warm(q, query_len=2)
    _warm(q, query_len=2)
    assert len(calls) == 1
    kw = calls[0]
    assert kw["layouts"] == ((16, 1),) and kw["modes"] == (("scalar", "fp8"),)
    assert kw["query_lens"] == (1, 2) and kw["max_model_len"] == 1024 * 128 and kw["q_dtype"] == "bf16"
    assert kw["workers"] == 1
    _warm(_FakeCuda((8, 16, 128)), query_len=2)  # another q of the same layout and device: warm already
    assert len(calls) == 1
    _warm(_FakeCuda((4, 64, 128)))  # another layout: its own warm-up
    assert len(calls) == 2 and calls[1]["layouts"] == ((64, 1),)
    _warm(_FakeCuda((4, 64, 128), device=_FakeDevice()))  # another GPU of the process: its own too
    assert len(calls) == 3


def test_switched_off_and_skipped_off_the_model_s_shapes(calls, monkeypatch):
    monkeypatch.setenv(vllm_plugin.ENV_WARMUP, "0")
    _warm(_FakeCuda((4, 16, 128)))
    monkeypatch.delenv(vllm_plugin.ENV_WARMUP)
    _warm(_FakeCuda((4, 8, 64)))  # head_dim 64: not MiniMax-M3's
    _warm(_FakeCuda((4, 8, 128)), topk=4)
    assert calls == []


def test_a_bad_switch_or_worker_count_is_named_not_ignored(calls, monkeypatch):
    """MSA_TUNE_WARMUP takes on/off spellings; another value, or a worker count that is no int >= 1,
    warms nothing: a ValueError naming the variable, which the plugin logs as its warning while the
    call itself goes on (_say_table)."""
    monkeypatch.setenv(vllm_plugin.ENV_WARMUP, "off")
    _warm(_FakeCuda((4, 16, 128)))
    assert calls == []
    for name, value, said in ((vllm_plugin.ENV_WARMUP, "maybe", "MSA_TUNE_WARMUP: expected one of"),
                              (vllm_plugin.ENV_WARMUP_WORKERS, "abc", "MSA_TUNE_WARMUP_WORKERS: expected an int >= 1"),
                              (vllm_plugin.ENV_WARMUP_WORKERS, "0", "MSA_TUNE_WARMUP_WORKERS: expected an int >= 1")):
        monkeypatch.delenv(vllm_plugin.ENV_WARMUP, raising=False)
        monkeypatch.setenv(name, value)
        monkeypatch.setattr(vllm_plugin, "_said", set())
        with pytest.raises(ValueError, match=said):
            _warm(_FakeCuda((4, 16, 128)))
        monkeypatch.delenv(name)
    assert calls == []
