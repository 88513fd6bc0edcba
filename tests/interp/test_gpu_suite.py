"""codegen.gpu_suite: the GPU suite's configs and the tuned-table entries it runs (CPU checks)."""
import json

import pytest

from codegen import LaunchConfig, gpu_suite
from codegen.configs import validate_config
from codegen.tuned_store import REPO_CONFIG_DIR

TABLE = REPO_CONFIG_DIR / "sm90__NVIDIA_H200.json"


def test_every_config_of_the_tuned_table_runs_once_at_its_smallest_bucket():
    entries = gpu_suite.tuned_entries(TABLE)
    doc = json.loads(TABLE.read_text())
    want = set()
    for table, body in doc["tables"].items():
        for bucket, entry in body["buckets"].items():
            want.add((table, LaunchConfig.from_dict(entry["config"]), False))
            if "per_token" in entry:
                want.add((table, LaunchConfig.from_dict(entry["per_token"]["config"]), True))
    got = [(e.table, e.config, e.per_token) for e in entries]
    assert len(got) == len(set(got)) and set(got) == want
    for e in entries:
        buckets = [int(b) for b, x in doc["tables"][e.table]["buckets"].items()
                   if LaunchConfig.from_dict((x.get("per_token") if e.per_token else x)["config"]) == e.config]
        assert e.bucket == min(buckets)


def test_a_bucket_with_only_a_per_token_entry(tmp_path):
    """A tune whose budget ran out between its tiled and per-token studies leaves buckets that hold a
    per_token sub-entry alone (a valid table: the loader reads each path's buckets): the suite runs
    that config on the per-token path and finds no tiled config there."""
    doc = json.loads(TABLE.read_text())
    name, body = next((n, b) for n, b in sorted(doc["tables"].items()) if n.startswith("prefill"))
    bucket, entry = next((b, e) for b, e in body["buckets"].items() if "per_token" in e)
    body["buckets"] = {bucket: {"per_token": entry["per_token"]}}
    doc["tables"] = {name: body}
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(doc))
    got = gpu_suite.tuned_entries(path)
    assert [(e.table, e.bucket, e.per_token) for e in got] == [(name, int(bucket), True)]
    assert got[0].config == LaunchConfig.from_dict(entry["per_token"]["config"])


@pytest.mark.parametrize("index", range(0, 75, 7))
def test_a_tuned_entrys_shape_is_its_bucket_or_smaller(index):
    entries = gpu_suite.tuned_entries(TABLE)
    entry = entries[index % len(entries)]
    shape = gpu_suite.tuned_case_shape(entry)
    assert shape["batch"] * shape["tokens"] == min(entry.bucket, gpu_suite.TUNED_MAX_TOKENS)
    assert entry.table.split("/")[1:] == [shape["scale_mode"], shape["kv_dtype"],
                                          f"{shape['num_q_heads']}x{shape['num_kv_heads']}"]
    assert (shape["tokens"] == 1) == entry.table.startswith("decode")


def test_a_decode_entrys_shape_on_multi_token_requests():
    entries = gpu_suite.tuned_entries(TABLE)
    decode = [e for e in entries if e.table.startswith("decode")]
    for entry in decode:
        shape = gpu_suite.tuned_case_shape(entry, query_len=4)
        tokens = min(entry.bucket, gpu_suite.TUNED_MAX_TOKENS)
        assert shape["tokens"] == 4 and shape["batch"] == max(1, tokens // 4)
    prefill = next(e for e in entries if e.table.startswith("prefill"))
    with pytest.raises(ValueError, match="query_len"):
        gpu_suite.tuned_case_shape(prefill, query_len=4)
    with pytest.raises(ValueError, match="query_len"):
        gpu_suite.tuned_case_shape(decode[0], query_len=0)


def test_the_suite_configs_are_valid_and_distinct():
    configs = gpu_suite.suite_configs()
    for family, items in configs.items():
        assert len(items) == len(set(items)) > 3
        for config in items:
            validate_config(config, arch="sm90", kernel=family, topk=16)
    assert gpu_suite.DECODE_FUSED.fuses_merge and not gpu_suite.DECODE_UNFUSED.fuses_merge
    assert gpu_suite.DECODE_UNFUSED.launches_merge and any(c.block_t > 1 for c in configs["prefill"])
