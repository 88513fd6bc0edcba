"""Call plans on a GPU (codegen.plan): bound launches of compiled kernels, per-stream buffers,
TMA descriptors per cache tensor, graphs. Each result is compared with the reference."""
import pytest
import torch

from codegen import cases, gpu_suite, plan
from codegen.accuracy import compare
from codegen.validate import detect_device_arch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def arch():
    return detect_device_arch(torch.device("cuda"))


def _decode(arch, seed, **kw):
    return cases.decode_case(arch=arch, seq_lens=[3000, 900, 17, 5000], num_q_heads=16, num_kv_heads=1,
                             q_dtype=torch.bfloat16, device="cuda", seed=seed, **kw)


def _prefill(arch, seed, pattern="random"):
    return cases.prefill_case(arch=arch, q_lens=[40, 7, 130], prefix_lens=[3000, 0, 900], num_q_heads=16,
                              num_kv_heads=1, q_dtype=torch.bfloat16, device="cuda", seed=seed, pattern=pattern)


def _ok(case):
    # float64 on the GPU (issue 25: the CPU loop was most of a GPU test's time)
    return compare(case.output, cases.run_reference(case, dtype=torch.float64, on_device=True), torch.bfloat16)


def test_the_plan_launches_compiled_kernels_directly(arch):
    case = _decode(arch, 0)
    plan.PLANS.clear()
    cases.run_kernel(case, config=gpu_suite.DECODE_FUSED)
    (built,) = plan.PLANS._plans.values()
    assert all(launch.launcher is not None for launch in built.launches), "fell back to the JIT path"
    for seed in (1, 2):  # the bound path, on new inputs of the same shapes
        fresh = _decode(arch, seed)
        fresh.poison()
        cases.run_kernel(fresh, config=gpu_suite.DECODE_FUSED)
        torch.cuda.synchronize()
        assert _ok(fresh).ok
    assert len(plan.PLANS) == 1


@pytest.mark.parametrize("kind", ["decode_fused", "decode_merge_kernel", "prefill_auto"])
def test_two_streams_at_once(arch, kind):
    """Calls in flight on two streams never share buffers (partials, arrival counters)."""
    if kind.startswith("decode"):
        config = gpu_suite.DECODE_FUSED if kind == "decode_fused" else gpu_suite.DECODE_UNFUSED
        make, kw = (lambda seed: _decode(arch, seed)), dict(config=config)
    else:
        make, kw = (lambda seed: _prefill(arch, seed, "correlated")), dict(config=gpu_suite.PREFILL_TILES,
                                                                           selection="auto")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    work = [[make(10 * s + i) for i in range(4)] for s in range(2)]
    for group in work:
        for case in group:
            case.poison()
    torch.cuda.synchronize()
    for i in range(4):  # interleaved, no synchronization between the streams
        for stream, group in zip(streams, work):
            with torch.cuda.stream(stream):
                cases.run_kernel(group[i], **kw)
    torch.cuda.synchronize()
    for group in work:
        for case in group:
            result = _ok(case)
            assert result.ok, result


def test_each_layer_cache_gets_its_own_descriptor(arch):
    """Layers share metadata and shapes but not caches: each call reads its own (TMA where the
    config asks for it)."""
    layers = [_decode(arch, 20 + i) for i in range(3)]
    for layer in layers[1:]:
        for name in ("block_table", "seq_lens", "topk_idx"):
            layer.args[name] = layers[0].args[name]
    config = gpu_suite.DECODE_ONE_SPLIT  # kv_tma 1, the default
    for _ in range(2):
        for layer in layers:
            layer.poison()
            cases.run_kernel(layer, config=config)
            torch.cuda.synchronize()
            assert _ok(layer).ok


def test_graph_capture_after_eager_calls_on_the_same_stream(arch):
    """A capture never reuses an eager plan's buffers, and eager calls after it stay right."""
    config = gpu_suite.DECODE_FUSED
    stream = torch.cuda.Stream()
    case = _decode(arch, 30)
    with torch.cuda.stream(stream):
        cases.run_kernel(case, config=config)  # an eager plan on this stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        cases.run_kernel(case, config=config)
    for seed in (31, 32):
        case.refill_from(_decode(arch, seed))
        graph.replay()
        torch.cuda.synchronize()
        assert _ok(case).ok
        eager = _decode(arch, seed + 10)
        eager.poison()
        with torch.cuda.stream(stream):
            cases.run_kernel(eager, config=config)
        torch.cuda.synchronize()
        assert _ok(eager).ok
