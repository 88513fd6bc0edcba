"""Call plans (codegen.plan): a call shape's plan is built once and reused, and every change of
what it depends on gives a fresh one. Each call is compared with the float64 reference, so a
stale plan (wrong config, strides, grid or cache) fails on the numbers, not only on a counter."""
import json
import os

import pytest
import torch

from codegen import LaunchConfig, cases, plan, tuned_store
from codegen import api as api_module
from codegen.accuracy import compare, gate_dtype

SMALL = dict(head_dim=32, topk=4, arch="sm90")


def _decode(seed=0, **kw):
    shape = dict(seq_lens=[300, 700], num_q_heads=8, num_kv_heads=2, kv_dtype="fp8", scale_mode="scalar")
    shape.update(kw)
    return cases.decode_case(seed=seed, **shape, **SMALL)


def _prefill(seed=0, **kw):
    shape = dict(q_lens=[5, 6], prefix_lens=[0, 600], num_q_heads=8, num_kv_heads=2, kv_dtype="fp8",
                 scale_mode="scalar", pattern="correlated")
    shape.update(kw)
    return cases.prefill_case(seed=seed, **shape, **SMALL)


@pytest.fixture
def builds(monkeypatch):
    """Counts plan builds per kernel family."""
    counts = {"prefill": 0, "decode": 0}
    for family in counts:
        real = getattr(api_module, f"_plan_{family}")

        def spy(*args, _real=real, _family=family, **kwargs):
            counts[_family] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(api_module, f"_plan_{family}", spy)
    return counts


def _run_checked(case, **kw):
    case.poison()
    out = cases.run_kernel(case, arch="sm90", **kw)
    result = compare(out, cases.run_reference(case), gate_dtype(case.args["q"].dtype, kw.get("config")))
    assert result.ok, result
    return out


def test_one_plan_serves_every_layer_of_a_step(builds):
    """Layers: the same metadata, their own q, cache, top-k, scales and output. One build."""
    first = _decode(seed=1)
    for seed in (1, 2, 3):
        layer = _decode(seed=seed)
        for name in ("block_table", "seq_lens"):
            layer.args[name] = first.args[name]
        layer.args["topk_idx"] = first.args["topk_idx"].clone()  # the same selections, another tensor
        _run_checked(layer)
    assert builds["decode"] == 1
    assert len(plan.PLANS) == 1


def test_new_metadata_of_the_same_shapes_reuses_the_plan(builds):
    for seed in (4, 5):
        _run_checked(_prefill(seed=seed))  # other blocks selected, pages in another order: same shapes
    assert builds["prefill"] == 1


CHANGES = {
    "shape": lambda: _decode(seq_lens=[300, 700, 40]),
    "query_len": lambda: _decode(decode_query_len=2),
    "dtype": lambda: _decode(kv_dtype="bf16", scale_mode="none"),
    "scale_mode": lambda: _decode(scale_mode="per_token_head"),
    "heads": lambda: _decode(num_q_heads=16, num_kv_heads=2),
    "stride": lambda: _decode(strided=False),
    "varlen": lambda: _decode(varlen_q_lens=[1, 2], padded_rows=1),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_gives_a_fresh_plan(builds, change):
    _run_checked(_decode(seed=7))
    _run_checked(CHANGES[change]())
    assert builds["decode"] == 2, change
    _run_checked(_decode(seed=8))  # and the first shape's plan is still there, and still right
    assert builds["decode"] == 2


def test_a_different_cache_tensor_is_read(builds):
    """The plan keeps no cache: a new cache tensor of the same layout (another layer) is the one
    read, through a descriptor of its own where TMA applies."""
    case = _decode(seed=9)
    _run_checked(case)
    other = case.args["kv_cache"].clone()
    other.copy_(torch.randn(other.shape).to(other.dtype))
    case.args["kv_cache"] = other
    _run_checked(case)
    assert builds["decode"] == 1


def test_sm_scale_and_num_kv_heads_are_part_of_the_key(builds):
    case = _decode(seed=10)
    _run_checked(case)
    case.args["sm_scale"] = case.args["sm_scale"] * 0.5
    _run_checked(case)
    assert builds["decode"] == 2
    case.args["num_kv_heads"] = True  # == 1 and hashes like it, but is refused by name
    with pytest.raises(TypeError, match="num_kv_heads"):
        cases.run_kernel(case, arch="sm90")


def test_a_given_config_gives_its_own_plan(builds):
    case = _prefill(seed=11)
    outs = []
    for config in (LaunchConfig(block_n=32, block_t=2), LaunchConfig(block_n=64, block_t=1),
                   {"block_n": 32, "block_t": 2}):
        outs.append(_run_checked(case, config=config).clone())
    assert builds["prefill"] == 3  # a dict and an equal LaunchConfig are separate keys: each validated
    _run_checked(case, config=LaunchConfig(block_n=32, block_t=2))
    assert builds["prefill"] == 3


def test_bad_input_is_refused_by_name_after_a_plan_exists():
    case = _decode(seed=12)
    _run_checked(case)
    bad = dict(case.args, topk_idx=case.args["topk_idx"].long())
    with pytest.raises(TypeError, match="topk_idx"):
        api_module.sparse_attn_decode(**bad, arch="sm90")
    bad = dict(case.args, output=case.args["output"][:1])
    with pytest.raises(ValueError, match="output"):
        api_module.sparse_attn_decode(**bad, arch="sm90")
    with pytest.raises(TypeError, match="q"):
        api_module.sparse_attn_decode(**dict(case.args, q=[1.0]), arch="sm90")
    with pytest.raises(TypeError, match="config"):
        api_module.sparse_attn_decode(**case.args, arch="sm90", config=[("block_n", 32)])


def _table_source(config: dict) -> str:
    """A tuned-config file for the interpreter's device: one decode table (8 q / 2 KV heads), one
    bucket of 2 tokens, fresh for the current templates."""
    from codegen.loader import current_inputs_sha256

    doc = tuned_store.new_document("sm90", "cpu-interpreter")
    provenance = {key: None for key in tuned_store._PROVENANCE_KEYS}
    provenance.update(measured=True, arch="sm90", inputs_sha256=current_inputs_sha256("sm90", "decode", "scalar"))
    doc["tables"][tuned_store.table_key("decode", "scalar", "fp8", 8, 2)] = {
        "provenance": provenance,
        "buckets": {"2": dict(config=LaunchConfig(**config).to_dict(), is_default=False, default_us=10.0,
                              tuned_us=8.0, trials=5, failures=0)},
    }
    return json.dumps(tuned_store.validate_document(doc))


def test_a_rewritten_table_file_gives_a_fresh_plan(builds, tmp_path, monkeypatch):
    from codegen import get_config

    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(tmp_path))
    case = _decode(seed=13)
    _run_checked(case)
    assert builds["decode"] == 1
    tuned = get_config("decode", "sm90", "cpu-interpreter", "scalar", "fp8", 8, 2, 2, 4)
    assert not tuned.is_tuned
    path = tuned_store.file_name("sm90", "cpu-interpreter")
    source = _table_source(dict(block_n=32, num_splits=2, fused_merge=1))
    (tmp_path / path).write_text(source)
    assert get_config("decode", "sm90", "cpu-interpreter", "scalar", "fp8", 8, 2, 2, 4).config.fused_merge == 1
    _run_checked(case)
    assert builds["decode"] == 2
    chosen = next(iter(plan.PLANS._plans.values())).config
    assert chosen.fused_merge == 1 and chosen.num_splits == 2
    os.utime(tmp_path / path, ns=(1, 1))  # rewritten again (another mtime): another fresh plan
    _run_checked(case)
    assert builds["decode"] == 3


def test_an_in_place_change_of_a_step_tensor_is_seen(builds):
    """The step's metadata objects are remembered by identity, version and address: an in-place
    resize of the same object is re-validated (here: refused), not served from the plan."""
    case = _decode(seed=14)
    _run_checked(case)
    _run_checked(case)
    assert builds["decode"] == 1
    table = case.args["block_table"]
    table.resize_(1, table.shape[1])
    with pytest.raises(ValueError, match="block_table"):
        cases.run_kernel(case, arch="sm90")


def test_roles_split_into_layer_and_step_tensors():
    # codegen.plan.call_key compares exactly four step tensors by identity
    for roles in (api_module.PREFILL_ROLES, api_module.DECODE_ROLES):
        assert len(roles) == plan.LAYER_TENSORS + 4
        assert roles[:plan.LAYER_TENSORS] == ("q", "kv_cache", "topk_idx", "output", "k_scale", "v_scale")


@pytest.mark.parametrize("family", ["prefill", "decode"])
def test_step_plans_run_each_layer_like_the_drop_in(builds, family):
    """plan_*(metadata).run(layer tensors): the same results as the drop-in, one call plan for
    the step's layers, a new layout validated (and refused by name) before it runs."""
    from codegen import plan_decode, plan_prefill

    make = _prefill if family == "prefill" else _decode
    first = make(seed=20)
    a = first.args
    if family == "prefill":
        step = plan_prefill(a["block_table"], a["cu_seqlens_q"], a["seq_lens"], a["prefix_lens"], a["max_query_len"],
                            a["num_kv_heads"], a["sm_scale"], arch="sm90")
    else:
        step = plan_decode(a["block_table"], a["seq_lens"], a["num_kv_heads"], a["sm_scale"], a["decode_query_len"],
                           arch="sm90")
    for seed in (20, 21, 22):
        layer = make(seed=seed)
        layer.args.update({name: a[name] for name in ("block_table", "seq_lens", "cu_seqlens_q", "prefix_lens",
                                                      "topk_idx") if name in a})
        layer.poison()
        out = step.run(*(layer.args[name] for name in ("q", "kv_cache", "topk_idx", "output", "k_scale", "v_scale")))
        assert out is layer.output
        assert compare(out, cases.run_reference(layer), gate_dtype(torch.float32)).ok
    assert builds[family] == 1 and len(step._plans) == 1
    with pytest.raises(TypeError, match="q"):
        step.run(a["q"].double(), a["kv_cache"], a["topk_idx"], a["output"], a["k_scale"], a["v_scale"])


def test_inside_a_graph_capture_no_plan_is_kept_or_reused(builds, monkeypatch):
    """A capture builds the call's launches in the capture and keeps nothing: an eager plan of the
    same key is not used (its buffers would be baked into the graph), and the capture's own plan is
    not stored (its memory belongs to the graph). Fused-merge counters come from the device's
    shared buffer there (codegen.workspace.call_counters)."""
    from codegen import workspace

    case = _decode(seed=15)
    config = LaunchConfig(block_n=32, num_splits=2, fused_merge=1)
    _run_checked(case, config=config)
    assert builds["decode"] == 1 and len(plan.PLANS) == 1
    shared = []
    real = workspace.arrival_counters
    monkeypatch.setattr(workspace, "arrival_counters", lambda *a, **k: shared.append(a) or real(*a, **k))
    eager_state = plan.device_state
    monkeypatch.setattr(plan, "device_state", lambda q: (-1, 0, True))  # as inside torch.cuda.graph
    for _ in range(2):
        _run_checked(case, config=config)
    assert builds["decode"] == 3 and len(plan.PLANS) == 1  # built each time, never stored
    assert shared, "a captured fused merge takes the device's shared counters"
    monkeypatch.setattr(plan, "device_state", eager_state)
    _run_checked(case, config=config)
    assert builds["decode"] == 3  # out of the capture, the eager plan serves again


def test_kept_plans_own_a_bounded_amount_of_memory(monkeypatch):
    """Plans are dropped oldest first past the byte bound of the buffers they own (a tuner meets
    hundreds of configs, each decode plan with its split-K partials)."""
    monkeypatch.setattr(plan.PLANS, "max_bytes", 1)  # every plan owns partials: one kept at a time
    case = _decode(seed=16)
    for splits in (2, 3):
        _run_checked(case, config=LaunchConfig(block_n=32, num_splits=splits))
    assert len(plan.PLANS) == 1 and plan.PLANS.owned_bytes() > 0
    (kept,) = plan.PLANS._plans.values()
    assert kept.config.num_splits == 3


def test_a_profiler_s_launch_hooks_are_seen():
    """Bound launches go the JIT's way (with launch metadata) while a launch hook is registered."""
    from triton import knobs

    from codegen import bound_launch

    assert not bound_launch._hooks_active()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert bound_launch._hooks_active()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not bound_launch._hooks_active()
