"""`python -m codegen restamp`: a table moves to the current template hash only when its kernels
compile exactly as in the tree it was fresh at (real compiles, this process's Triton)."""
import pathlib
import shutil

import pytest

from codegen import restamp, tuned_store
from codegen.configs import LaunchConfig
from codegen.loader import current_inputs_sha256
from codegen.render import REPO_ROOT

KEY = "decode/scalar/fp8/16x1"
CONFIG = LaunchConfig(block_n=64, num_warps=4, num_stages=2, num_splits=2, fused_merge=1, kv_upcast=2)
FAKE = "a" * 64


def _old_tree(tmp_path, edit=None) -> pathlib.Path:
    """A source tree whose generated modules are the current ones under another template hash, with
    `edit(text) -> text` applied to the decode split module."""
    tree = tmp_path / "before"
    shutil.copytree(REPO_ROOT / "codegen" / "generated", tree / "codegen" / "generated")
    for name in ("sm90_decode_split_scalar", "sm90_decode_merge_scalar"):
        path = tree / "codegen" / "generated" / f"{name}.py"
        text = path.read_text()
        old_hash = text.rsplit("INPUTS_SHA256 = '", 1)[1][:64]
        text = text.replace(old_hash, FAKE)
        if edit and "split" in name:
            text = edit(text)
        path.write_text(text)
    return tree


def _tuned_file(tmp_path, recorded: str) -> pathlib.Path:
    prov = dict(measured=True, gpu_name="NVIDIA H200", arch="sm90", triton="3.6.0", torch="2.11", cuda="13.0",
                hip=None, inputs_sha256=recorded, date="2026-12-01", command="test")
    entry = dict(config=CONFIG.to_dict(), is_default=False, default_us=2.0, tuned_us=1.0, trials=2, failures=0)
    doc = tuned_store.new_document("sm90", "NVIDIA H200")
    doc["tables"][KEY] = dict(provenance=prov, buckets={"1": entry})
    path = tmp_path / "sm90__NVIDIA_H200.json"
    tuned_store.write_document(path, doc)
    return path


def _fake_then():
    return f"{FAKE[:16]}+{FAKE[:16]}"


def test_a_launch_only_change_is_carried(tmp_path):
    # The old tree differs only outside the kernels (a docstring of `launch`): the table moves.
    tree = _old_tree(tmp_path, lambda t: t.replace('"""Launches on validated arguments', '"""Launches, on validated arguments'))
    path = _tuned_file(tmp_path, _fake_then())
    [verdict] = restamp.restamp(path, str(tree))
    assert verdict.restamped and verdict.kernels_compared == 1, verdict
    prov = tuned_store.read_document(path)["tables"][KEY]["provenance"]
    assert prov["inputs_sha256"] == current_inputs_sha256("sm90", "decode", "scalar")
    assert [r["from_inputs_sha256"] for r in prov["restamped"]] == [_fake_then()]
    assert restamp.restamp(path, str(tree))[0].reason == "fresh already"


def test_a_changed_kernel_is_left_stale(tmp_path):
    # A change inside a @triton.jit function that changes the code (the score scale's constant): refused.
    tree = _old_tree(tmp_path, lambda t: t.replace("sm_scale * 1.4426950408889634", "sm_scale * 1.44", 1))
    path = _tuned_file(tmp_path, _fake_then())
    [verdict] = restamp.restamp(path, str(tree))
    assert not verdict.restamped and "its @triton.jit source changed" in verdict.reason, verdict
    assert tuned_store.read_document(path)["tables"][KEY]["provenance"]["inputs_sha256"] == _fake_then()


def test_a_kernel_change_no_config_reaches_is_carried_after_every_specialization(tmp_path):
    # A @triton.jit source changed (a comment) but compiles the same: every specialization is compiled
    # from both trees (uniform and varlen rows, TMA and its plain-load fallback), and the table moves.
    tree = _old_tree(tmp_path, lambda t: t.replace("    split = tl.program_id(2)\n",
                                                  "    split = tl.program_id(2)  # old\n", 1))
    path = _tuned_file(tmp_path, _fake_then())
    [verdict] = restamp.restamp(path, str(tree))
    assert verdict.restamped and "every specialization compiled" in verdict.reason, verdict
    assert verdict.kernels_compared == 4, verdict  # {TMA, plain} x {uniform, varlen}, one split kernel each


def test_a_table_stale_before_is_left_and_bad_refs_are_refused(tmp_path):
    tree = _old_tree(tmp_path)
    path = _tuned_file(tmp_path, "b" * 16 + "+" + "b" * 16)
    [verdict] = restamp.restamp(path, str(tree), dry_run=True)
    assert not verdict.restamped and "stale at" in verdict.reason
    with pytest.raises(ValueError, match="--before"):
        restamp.restamp(path, "no-such-ref-xyz")


def test_a_changed_specialization_is_left_stale(tmp_path, monkeypatch):
    # The kernels' source is the same but `constexprs` specializes them differently (16 -> 32 rows).
    tree = _old_tree(tmp_path, lambda t: t.replace("BLOCK_M=max(16,", "BLOCK_M=max(32,"))
    path = _tuned_file(tmp_path, _fake_then())
    [verdict] = restamp.restamp(path, str(tree), dry_run=True)
    assert not verdict.restamped and "specialized differently" in verdict.reason, verdict
    # And the compiles themselves tell it apart, without the constexprs comparison.
    monkeypatch.setattr(restamp, "_specializations_equal", lambda *a: True)
    [verdict] = restamp.restamp(path, str(tree))
    assert not verdict.restamped and "compiles differently" in verdict.reason, verdict


def test_a_specialization_the_compile_does_not_cover_is_compared_too(tmp_path):
    # Only varlen launches would differ (the compile runs the uniform batch): still left stale.
    tree = _old_tree(tmp_path, lambda t: t.replace("VARLEN=varlen,", "VARLEN=varlen and False,"))
    path = _tuned_file(tmp_path, _fake_then())
    [verdict] = restamp.restamp(path, str(tree))
    assert not verdict.restamped and "specialized differently" in verdict.reason, verdict
