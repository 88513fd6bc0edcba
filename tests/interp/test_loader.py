"""The runtime loader: exact, nearest, default, stale, broken and wrong-device files."""
import json
import warnings

import pytest
import triton

from codegen import LaunchConfig, get_config, loader, tuned_store


def _prov(**change):
    prov = dict(measured=True, gpu_name="NVIDIA H200", arch="sm90", triton=triton.__version__, torch="x",
                cuda="x", hip=None, inputs_sha256=loader.current_inputs_sha256("sm90", "decode", "scalar"),
                date="2026-11-29", command="msa-tune")
    prov.update(change)
    return prov


def _write(folder, doc):
    path = folder / tuned_store.file_name(doc["arch"], doc["device"])
    tuned_store.write_document(path, doc)
    return path


def _doc(prov=None, buckets=(1, 16)):
    doc = tuned_store.new_document("sm90", "NVIDIA H200")
    doc["tables"]["decode/scalar/fp8/16x1"] = {
        "provenance": prov or _prov(),
        "buckets": {str(b): dict(config=LaunchConfig(block_n=128, num_splits=b % 8 + 1).to_dict(), is_default=False,
                                 default_us=10.0, tuned_us=8.0, trials=5, failures=0) for b in buckets},
    }
    return doc


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(tmp_path))
    # A file the override lacks is looked up in the repository's folder: none of its files may answer here
    # (an H100 table shipped there would stand in for the one a test means to be absent).
    monkeypatch.setattr(tuned_store, "REPO_CONFIG_DIR", tmp_path / "repository")
    loader._load.cache_clear()
    loader._warned.clear()
    return tmp_path


def _get(tokens, device="NVIDIA H200 NVL", mode="scalar"):
    return get_config("decode", "sm90", device, mode, "fp8", 16, 1, tokens)


def test_an_override_that_names_no_folder_is_said(config_dir, monkeypatch):
    """A typo in MSA_TUNE_CONFIG_DIR: the repository's tables still serve, with one warning naming it."""
    missing = config_dir / "no-such-folder"
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(missing))
    with pytest.warns(RuntimeWarning, match=f"{missing}: {tuned_store.CONFIG_DIR_ENV} names no folder"):
        _get(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process, not once a lookup
        _get(16)
    monkeypatch.setenv(tuned_store.CONFIG_DIR_ENV, str(config_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an existing folder, even an empty one, is said nothing of
        _get(16)


def test_exact_bucket(config_dir):
    _write(config_dir, _doc())
    choice = _get(16)
    assert choice.is_tuned and choice.source == "tuned:exact" and choice.bucket == 16
    assert choice.config == LaunchConfig(block_n=128, num_splits=1 + 16 % 8)


def test_nearest_bucket_in_log2_space(config_dir):
    _write(config_dir, _doc())
    assert _get(3).bucket == 1  # log2 3 = 1.58 is nearer 0 than 4
    assert _get(5).bucket == 16  # 2.32 is nearer 4 than 0
    assert _get(4).bucket == 1  # a tie goes to the smaller bucket
    assert _get(1000).source == "tuned:nearest"


def test_default_when_no_table_or_no_file(config_dir):
    _write(config_dir, _doc())
    choice = _get(16, mode="per_token_head")
    assert not choice.is_tuned and choice.source == "default" and "has no table" in choice.reason
    choice = _get(16, device="NVIDIA H20")  # same arch, another shape (78 SMs): borrows nothing
    assert not choice.is_tuned and "no tuned-config file sm90__NVIDIA_H20.json" in choice.reason


H100 = "NVIDIA H100 80GB HBM3"


def test_an_h100_without_a_table_borrows_the_h200s(config_dir):
    _write(config_dir, _doc())
    choice = _get(16, device=H100)
    assert choice.is_tuned and choice.source == "tuned:exact" and choice.config == _get(16).config
    assert "sm90__NVIDIA_H200.json (borrowed by NVIDIA_H100" in choice.reason
    assert "borrowed" not in _get(16).reason  # the H200 itself


def _own_h100_doc(**tables):
    doc = tuned_store.new_document("sm90", H100)
    for key, (config, measured) in tables.items():
        inputs = loader.current_inputs_sha256("sm90", "decode", key.split("/")[1])
        doc["tables"][key] = {"provenance": _prov(gpu_name=H100, measured=measured, inputs_sha256=inputs), "buckets": {
            "16": dict(config=config.to_dict(), is_default=not measured, default_us=10.0 if measured else None,
                       tuned_us=8.0 if measured else None, trials=5 if measured else 0, failures=0)}}
    return doc


def test_a_table_of_its_own_comes_before_the_borrowed_one(config_dir):
    _write(config_dir, _doc())
    _write(config_dir, _own_h100_doc(**{"decode/scalar/fp8/16x1": (LaunchConfig(block_n=32, num_warps=2), True)}))
    choice = _get(16, device=H100)
    assert choice.config == LaunchConfig(block_n=32, num_warps=2) and "borrowed" not in choice.reason
    assert "sm90__NVIDIA_H100.json" in choice.reason


def test_borrowing_is_per_table(config_dir):
    """A file of its own with some tables (a partial tune) leaves the others to the lender's file, and so
    does a table of its own that holds unmeasured defaults: it never hides a measured table."""
    _write(config_dir, _doc())
    own = _own_h100_doc(**{"decode/per_token_head/fp8/16x1": (LaunchConfig(block_n=32, num_warps=2), True)})
    _write(config_dir, own)
    assert _get(16, device=H100, mode="per_token_head").config == LaunchConfig(block_n=32, num_warps=2)
    scalar = _get(16, device=H100)
    assert scalar.config == _get(16).config and "borrowed by NVIDIA_H100" in scalar.reason
    _write(config_dir, _own_h100_doc(**{"decode/scalar/fp8/16x1": (LaunchConfig(), False)}))
    assert _get(16, device=H100).config == _get(16).config
    choice = _get(16, device=H100, mode="per_token_head")  # neither file has it
    assert not choice.is_tuned and "sm90__NVIDIA_H100.json, " in choice.reason and "has no table" in choice.reason


def test_borrowing_is_per_bucket(config_dir):
    """A table of its own that a partial tune left with some buckets serves those; a call nearer a bucket
    only the lender's table holds takes the lender's (its exact shape on a sibling GPU, not another shape
    on this one: results/h100/decode-retune-partial)."""
    _write(config_dir, _doc(buckets=(1, 16)))
    _write(config_dir, _own_h100_doc(**{"decode/scalar/fp8/16x1": (LaunchConfig(block_n=32, num_warps=2), True)}))
    own, lent = LaunchConfig(block_n=32, num_warps=2), _get(1).config
    assert own != lent
    one = _get(1, device=H100)
    assert one.config == lent and one.source == "tuned:exact" and "borrowed by NVIDIA_H100" in one.reason
    assert _get(3, device=H100).config == lent and _get(3, device=H100).bucket == 1  # nearest over both tables
    for tokens in (16, 1000):  # its own bucket, exact or nearest
        choice = _get(tokens, device=H100)
        assert choice.config == own and "borrowed" not in choice.reason and choice.bucket == 16


def test_no_table_of_its_own_nor_its_lenders(config_dir, monkeypatch):
    monkeypatch.setattr(tuned_store, "REPO_CONFIG_DIR", config_dir / "empty")
    choice = _get(16, device=H100)
    assert not choice.is_tuned and "nor one of its lender NVIDIA_H200" in choice.reason


def test_a_call_plan_stamp_sees_the_lenders_file_change(config_dir):
    """Call plans keep their config while their stamp is unchanged: an H100's must notice a new or
    rewritten H200 table (the one it borrows) and a table of its own appearing."""
    stamp = loader.TableStamp("sm90", H100)
    assert stamp.unchanged()
    path = _write(config_dir, _doc())
    assert not stamp.unchanged()
    stamp = loader.TableStamp("sm90", H100)
    _write(config_dir, _doc(buckets=(1, 16, 64)))
    _utime_forward(path)
    assert not stamp.unchanged()
    stamp = loader.TableStamp("sm90", H100)
    _write(config_dir, tuned_store.new_document("sm90", H100))
    assert not stamp.unchanged()


def _utime_forward(path):
    """Move a file's mtime a second on: two writes inside one clock tick keep one mtime."""
    import os

    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_stale_file_warns_once_and_still_serves(config_dir, monkeypatch):
    monkeypatch.setattr(loader, "_gpu_compiles", lambda: True)  # as on the GPU the table is for
    _write(config_dir, _doc(_prov(triton="0.0.1", inputs_sha256="old")))
    with pytest.warns(RuntimeWarning, match="stale") as record:
        choice = _get(16)
        _get(1)
    assert choice.is_tuned
    assert len([w for w in record if "triton 0.0.1" in str(w.message)]) == 1
    assert len([w for w in record if "other template inputs" in str(w.message)]) == 1


def test_no_triton_staleness_warning_on_the_cpu(config_dir):
    """On a CPU (the interpreter) the Triton that runs says nothing about the GPU a table was tuned
    on: no warning nobody can act on. Other template inputs still warn: re-tune after a change."""
    assert not loader._gpu_compiles()  # this suite runs under TRITON_INTERPRET=1
    _write(config_dir, _doc(_prov(triton="0.0.1")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _get(16).is_tuned
    _write(config_dir, _doc(_prov(triton="0.0.1", inputs_sha256="old"), buckets=(1, 16, 64)))
    with pytest.warns(RuntimeWarning, match="other template inputs") as record:
        _get(16)
    assert not [w for w in record if "tuned with triton" in str(w.message)]


def test_broken_file_warns_and_falls_back(config_dir):
    (config_dir / "sm90__NVIDIA_H200.json").write_text("{ not json")
    with pytest.warns(RuntimeWarning, match="broken"):
        choice = _get(16)
    assert not choice.is_tuned and choice.source == "default"


def test_schema_violation_is_broken(config_dir):
    doc = _doc()
    doc["tables"]["decode/scalar/fp8/16x1"]["buckets"]["16"]["config"]["blok_n"] = 64
    (config_dir / "sm90__NVIDIA_H200.json").write_text(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match="unknown key"):
        assert not _get(16).is_tuned


def test_file_for_another_device_is_ignored(config_dir):
    doc = _doc()
    doc["device"] = "NVIDIA_H100"
    (config_dir / "sm90__NVIDIA_H200.json").write_text(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match="another|not sm90/NVIDIA_H200"):
        choice = _get(16)
    assert not choice.is_tuned


def test_unmeasured_tables_are_not_tuned(config_dir):
    _write(config_dir, _doc(_prov(measured=False)))
    choice = _get(16)
    assert not choice.is_tuned and "unmeasured" in choice.reason


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "sm90__NVIDIA_H200.json"
    tuned_store.write_document(path, _doc())
    before = path.read_text()
    bad = _doc()
    bad["tables"]["decode/scalar/fp8/16x1"]["buckets"]["1"]["config"] = {"num_warps": 3}
    with pytest.raises(tuned_store.SchemaError):
        tuned_store.write_document(path, bad)
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_every_checked_in_file_validates():
    files = sorted(tuned_store.REPO_CONFIG_DIR.glob("*.json"))
    for path in files:
        doc = tuned_store.read_document(path)
        assert path.name == tuned_store.file_name(doc["arch"], doc["device"])
        for key, table in doc["tables"].items():
            if not table["provenance"]["measured"]:
                assert "not measured" in table["provenance"].get("note", ""), f"{path} {key}"


def test_no_checked_in_file_holds_only_defaults():
    """A file of unmeasured defaults (`msa-tune --write-defaults`) gives what the loader falls back
    to anyway, and goes stale with every template change: none is checked in. (A GPU without a
    file runs the arch defaults, which the static gate compiles at every decode bucket.)"""
    files = sorted(tuned_store.REPO_CONFIG_DIR.glob("*.json"))
    assert files, "the tuned tables (e.g. sm90__NVIDIA_H200.json) are missing"
    for path in files:
        tables = tuned_store.read_document(path)["tables"].values()
        assert any(t["provenance"]["measured"] for t in tables), f"{path.name}: only unmeasured defaults"


def test_no_checked_in_measured_bucket_kept_the_default_unmeasured():
    """A measured table's bucket that kept the default without timing any config (none passed,
    every trial ran out of GPU memory, the confirmation failed) ships a guess as if it were tuned:
    re-tune it before checking the table in (H200, 2026-12-03: decode 64x4@512 published so after
    every trial ran out of memory, caught only by reading the run's log)."""
    for path in sorted(tuned_store.REPO_CONFIG_DIR.glob("*.json")):
        for key, table in tuned_store.read_document(path)["tables"].items():
            if not table["provenance"]["measured"]:
                continue
            for launch_path in ("tiled", tuned_store.PER_TOKEN):
                for tokens, entry in tuned_store.path_entries(table, launch_path).items():
                    if entry.get("is_default") and entry.get("tuned_us") is None:
                        raise AssertionError(f"{path.name} {key}@{tokens} {launch_path}: "
                                             f"{entry.get('note') or 'unmeasured'}")


def test_per_token_lookup_takes_the_buckets_per_token_twin(config_dir):
    doc = tuned_store.new_document("sm90", "NVIDIA H200")
    tiles = {512: 1, 2048: 4, 8192: 4}
    doc["tables"]["prefill/scalar/fp8/16x1"] = {
        "provenance": _prov(inputs_sha256=loader.current_inputs_sha256("sm90", "prefill", "scalar")),
        "buckets": {str(b): dict(config=LaunchConfig(block_t=t, block_n=32 * t, num_stages=3).to_dict(),
                                 is_default=False, default_us=10.0, tuned_us=8.0, trials=5, failures=0)
                    for b, t in tiles.items()},
    }
    _write(config_dir, doc)
    get = lambda n=8192, **kw: get_config("prefill", "sm90", "NVIDIA H200", "scalar", "fp8", 16, 1, n, **kw)  # noqa: E731
    assert get().config == LaunchConfig(block_t=4, block_n=128, num_stages=3) and get().source == "tuned:exact"
    choice = get(per_token=True)  # the 8192 bucket's config with block_t 1, not the 512 bucket's
    assert choice.bucket == 8192 and choice.config == LaunchConfig(block_n=128, num_stages=3) and choice.is_tuned
    assert choice.source == "tuned:exact" and "per-token twin" in choice.reason
    choice = get(600, per_token=True)
    assert choice.bucket == 512 and choice.config == LaunchConfig(block_n=32, num_stages=3)
    assert choice.source == "tuned:nearest"
    with pytest.raises(ValueError, match="per_token: only prefill"):
        get_config("decode", "sm90", "NVIDIA H200", "scalar", "fp8", 16, 1, 1, per_token=True)


def test_the_api_lookup_finds_tuned_tables(config_dir, monkeypatch):
    # The API names the cache dtype as the tables do: an fp8 cache is "fp8", not "float8_e4m3fn".
    import torch

    from codegen import api

    assert tuned_store.kv_dtype_name(torch.float8_e4m3fn) == "fp8" == tuned_store.kv_dtype_name(torch.float8_e4m3fnuz)
    assert tuned_store.kv_dtype_name(torch.bfloat16) == "bf16"
    with pytest.raises(TypeError, match="kv_cache: expected an fp8, bf16 or fp16 dtype"):
        tuned_store.kv_dtype_name(torch.float32)
    _write(config_dir, _doc())
    monkeypatch.setattr(api, "device_name", lambda device: "NVIDIA H200")
    q = torch.zeros(16, 16, 128)
    kv_cache = torch.zeros(4, 1, 128, 256, dtype=torch.float8_e4m3fn)
    config = api._resolve_config(None, kernel="decode", arch="sm90", scale_mode="scalar", q=q, kv_cache=kv_cache,
                                 num_kv_heads=1, topk=16)
    assert config == _get(16).config and _get(16).is_tuned


def _prefill_doc(tiles: dict, per_token: dict):
    """A prefill table: {tokens: block_t} tiled entries and {tokens: block_n} per-token sub-entries
    (a bucket in `per_token` only holds just the sub-entry)."""
    doc = tuned_store.new_document("sm90", "NVIDIA H200")
    entry = lambda config: dict(config=config.to_dict(), is_default=False, default_us=10.0, tuned_us=8.0,  # noqa: E731
                                trials=5, failures=0)
    buckets = {str(b): entry(LaunchConfig(block_t=t, block_n=32 * t, num_stages=3)) for b, t in tiles.items()}
    for b, block_n in per_token.items():
        buckets.setdefault(str(b), {})["per_token"] = entry(LaunchConfig(block_n=block_n, num_warps=8))
    doc["tables"]["prefill/scalar/fp8/16x1"] = {
        "provenance": _prov(inputs_sha256=loader.current_inputs_sha256("sm90", "prefill", "scalar")),
        "buckets": buckets}
    return doc


def _prefill(n, **kw):
    return get_config("prefill", "sm90", "NVIDIA H200", "scalar", "fp8", 16, 1, n, **kw)


def test_per_token_lookup_prefers_the_per_token_sub_entries(config_dir):
    """A table with per-token sub-entries: the per-token path takes the exact or nearest bucket
    among those that have one (never a twin); the tiled path ignores them, and skips a bucket that
    holds only a sub-entry."""
    _write(config_dir, _prefill_doc({512: 1, 2048: 4, 8192: 4}, {2048: 64, 32768: 128}))
    choice = _prefill(2048, per_token=True)
    assert choice.config == LaunchConfig(block_n=64, num_warps=8) and choice.source == "tuned:exact"
    assert choice.is_tuned and "per-token entry" in choice.reason
    choice = _prefill(8192, per_token=True)  # 8192 has no sub-entry: the nearest that has one, not its twin
    assert choice.bucket == 2048 and choice.source == "tuned:nearest"
    assert _prefill(20000, per_token=True).config == LaunchConfig(block_n=128, num_warps=8)
    assert _prefill(8192).config == LaunchConfig(block_t=4, block_n=128, num_stages=3)  # tiled: unchanged
    choice = _prefill(32768)  # a sub-entry alone is no tiled bucket
    assert choice.bucket == 8192 and choice.source == "tuned:nearest"


def test_a_file_without_per_token_sub_entries_still_serves_twins(config_dir):
    """A file written before the per-token studies (no sub-entry anywhere) loads as it did."""
    doc = _prefill_doc({512: 1, 8192: 4}, {})
    path = config_dir / tuned_store.file_name("sm90", "NVIDIA H200")
    path.write_text(json.dumps(doc))  # as an old tuner wrote it, not through today's writer
    choice = _prefill(8192, per_token=True)
    assert choice.config == LaunchConfig(block_n=128, num_stages=3) and "per-token twin" in choice.reason


def test_per_token_sub_entries_are_checked_and_merged_path_by_path(tmp_path):
    """A per_token sub-entry must run block_t 1 and belong to a prefill table; a write of one path
    keeps the other path's entry of the bucket."""
    doc = _prefill_doc({512: 1}, {512: 64})
    doc["tables"]["prefill/scalar/fp8/16x1"]["buckets"]["512"]["per_token"]["config"]["block_t"] = 4
    with pytest.raises(tuned_store.SchemaError, match=r"per_token.config.block_t: the per-token path runs block_t 1"):
        tuned_store.validate_document(doc)
    decode = _doc()
    decode["tables"]["decode/scalar/fp8/16x1"]["buckets"]["1"]["per_token"] = dict(
        decode["tables"]["decode/scalar/fp8/16x1"]["buckets"]["1"])
    with pytest.raises(tuned_store.SchemaError, match="only prefill has a per-token path"):
        tuned_store.validate_document(decode)
    empty = _prefill_doc({512: 1}, {})
    empty["tables"]["prefill/scalar/fp8/16x1"]["buckets"]["1024"] = {}
    with pytest.raises(tuned_store.SchemaError, match=r"buckets\['1024'\]: missing key 'config'"):
        tuned_store.validate_document(empty)

    path, key = tmp_path / "sm90__NVIDIA_H200.json", "prefill/scalar/fp8/16x1"
    prov = _prefill_doc({}, {})["tables"][key]["provenance"]
    table = _prefill_doc({512: 1, 1024: 2}, {512: 64, 1024: 128})["tables"][key]["buckets"]
    tiled, sub = {k: v for k, v in table["512"].items() if k != "per_token"}, table["512"]["per_token"]
    tuned_store.update_table(path, "sm90", "NVIDIA H200", key, prov, {"512": {"per_token": sub}})  # first alone
    tuned_store.update_table(path, "sm90", "NVIDIA H200", key, prov, {"512": tiled})
    assert tuned_store.read_document(path)["tables"][key]["buckets"]["512"] == dict(tiled, per_token=sub)
    newer = dict(table["1024"]["per_token"])
    tuned_store.update_table(path, "sm90", "NVIDIA H200", key, prov, {"512": {"per_token": newer}})
    assert tuned_store.read_document(path)["tables"][key]["buckets"]["512"] == dict(tiled, per_token=newer)


def test_a_run_under_another_workload_starts_the_table_afresh(tmp_path):
    """Buckets timed at another decode context are not merged under the new run's provenance (which would
    then claim them): the table starts afresh, as for another GPU or Triton."""
    path, key = tmp_path / "sm90__NVIDIA_H200.json", "decode/scalar/fp8/16x1"
    workload = dict(decode_context=8192, prefill_prefix=0, pattern="correlated", head_dim=128, topk=16)
    doc = _doc(_prov(workload=workload), buckets=(1, 16))
    tuned_store.write_document(path, doc)
    entry = doc["tables"][key]["buckets"]["16"]
    for context, expected in ((8192, {"1", "16", "4"}), (131072, {"4"})):
        prov = _prov(workload=dict(workload, decode_context=context))
        tuned_store.update_table(path, "sm90", "NVIDIA H200", key, prov, {"4": entry})
        table = tuned_store.read_document(path)["tables"][key]
        assert set(table["buckets"]) == expected and table["provenance"] == prov, context


@pytest.mark.parametrize("moved, kept", [("prefill_ws", True), ("prefill", False), ("triton", False)])
def test_a_new_source_keeps_the_per_token_entries_its_kernel_did_not_change(tmp_path, moved, kept):
    """A tiled re-tune after only the Gluon module changed (`moved` prefill_ws) starts the table afresh
    but keeps its per-token entries, marked with the inputs they were measured under: the per-token walk
    runs the Triton-language module alone. A change of that module, or of Triton, keeps nothing."""
    from codegen.tuning.publish import per_token_survives

    path, key = tmp_path / "sm90__NVIDIA_H200.json", "prefill/scalar/fp8/16x1"
    old_doc = _prefill_doc({512: 1, 1024: 2}, {512: 64, 1024: 128})
    old_prov = old_doc["tables"][key]["provenance"]
    tuned_store.write_document(path, old_doc)
    parts = dict(zip(loader.prefill_parts("sm90", "scalar"), old_prov["inputs_sha256"].split("+")))
    assert list(parts) == ["prefill", "prefill_ws"]
    if moved in parts:
        parts[moved] = "0" * 16
    new_prov = dict(old_prov, inputs_sha256="+".join(parts.values()), date="2026-12-02",
                    triton="9.9.9" if moved == "triton" else old_prov["triton"])
    tiled = dict(old_doc["tables"][key]["buckets"]["512"])
    del tiled["per_token"]
    tuned_store.update_table(path, "sm90", "NVIDIA H200", key, new_prov, {"512": tiled},
                             unchanged_paths=per_token_survives("sm90", "prefill", "scalar"))
    table = tuned_store.read_document(path)["tables"][key]
    assert table["provenance"] == new_prov
    old_buckets = old_doc["tables"][key]["buckets"]
    if kept:
        assert table["buckets"]["512"] == dict(tiled, per_token=dict(
            old_buckets["512"]["per_token"], measured_inputs_sha256=old_prov["inputs_sha256"]))
        assert table["buckets"]["1024"] == {"per_token": dict(
            old_buckets["1024"]["per_token"], measured_inputs_sha256=old_prov["inputs_sha256"])}
    else:
        assert table["buckets"] == {"512": tiled}
    assert per_token_survives("sm90", "decode", "scalar") is None
