"""The generated modules match the templates, and rendering is strict."""
import shutil

import jinja2
import pytest

from codegen import render
from codegen.variants import Variant, all_variants


def test_committed_modules_match_templates():
    assert render.drifted() == []


def test_drift_is_detected_and_named(tmp_path, monkeypatch):
    copy = tmp_path / "generated"
    shutil.copytree(render.GENERATED_DIR, copy)
    monkeypatch.setattr(render, "GENERATED_DIR", copy)
    victim = copy / "sm90_decode_split_scalar.py"
    victim.write_text(victim.read_text().replace("tl.exp2", "tl.exp"))
    (copy / "gfx942_prefill_none.py").unlink()
    problems = render.drifted()
    assert any("sm90_decode_split_scalar.py: differs" in p for p in problems)
    assert any("gfx942_prefill_none.py: missing" in p for p in problems)
    assert len(problems) == 2


def test_check_command_exit_code(tmp_path, monkeypatch):
    from codegen.__main__ import main

    assert main(["render", "--check"]) == 0
    copy = tmp_path / "generated"
    shutil.copytree(render.GENERATED_DIR, copy)
    (copy / "stale_module.py").write_text("# old\n")
    monkeypatch.setattr(render, "GENERATED_DIR", copy)
    assert main(["render", "--check"]) == 1


def test_missing_template_parameter_is_an_error(monkeypatch):
    params = render.template_params
    monkeypatch.setattr(render, "template_params", lambda v: {k: x for k, x in params(v).items() if k != "use_pdl"})
    with pytest.raises(jinja2.UndefinedError):
        render.render(Variant("sm90", "decode_split", "scalar"))


def test_each_module_holds_only_its_scale_mode():
    """No runtime or constexpr scale-mode switch survives rendering."""
    for r in render.render_all():
        text = r.text
        assert "SCALE_MODE" not in text.split("SCALE_MODE = ", 1)[1].split("\n", 1)[1]  # only the constant
        if r.variant.scale_mode == "none":
            assert "k_scale_ptr" not in text and "v_scale_ptr" not in text
        if r.variant.kernel == "prefill_ws":
            # Gluon (gl.): the converter partition applies per-token scales; a scalar module has none of it
            if r.variant.scale_mode == "scalar":
                assert "qk_scale = sm_scale * 1.4426950408889634 * gl.load(k_scale_ptr)" in text
                assert "_page_scales" not in text and "stride_ks" not in text and "tops_s" not in text
            if r.variant.scale_mode == "per_token_head":
                assert "gl.load(k_scale_ptr)" not in text and "k_top = _top(ks_next)" in text
        elif r.variant.scale_mode == "scalar" and r.variant.kernel != "decode_merge" and r.variant.fold_scales:
            assert "k_sc = " not in text and "qk_scale = sm_scale * 1.4426950408889634 * tl.load(k_scale_ptr)" in text
        elif r.variant.scale_mode == "per_token_head" and r.variant.kernel != "decode_merge":
            assert "k_sc = tl.load(ks_row_ptr" in text and "p = p * v_sc[None, :]" in text
        assert "make_block_ptr" not in text


def test_variant_names_are_unique_and_importable():
    import importlib

    names = [v.name for v in all_variants()]
    # 2 archs x 3 kernels x 3 modes, + 6 unfolded baselines, + prefill_ws (sm90: scalar, per_token_head)
    assert len(names) == len(set(names)) == 26
    for v in all_variants():
        mod = importlib.import_module(v.module)
        assert mod.ARCH == v.arch and mod.SCALE_MODE == v.scale_mode
        assert mod.INPUTS_SHA256 == render.inputs_sha256(v)


def test_a_module_hash_covers_exactly_the_templates_it_renders_from(tmp_path, monkeypatch):
    """A decode-only template change moves the decode hashes and leaves prefill's (and its tuned
    configs) alone; a change to the shared _attend.jinja moves both."""
    shutil.copytree(render.TEMPLATE_DIR, tmp_path / "templates")
    monkeypatch.setattr(render, "TEMPLATE_DIR", tmp_path / "templates")
    prefill, split, merge = (Variant("sm90", k, "scalar") for k in ("prefill", "decode_split", "decode_merge"))
    before = {v: render.inputs_sha256(v) for v in (prefill, split, merge)}
    with open(tmp_path / "templates" / "_merge.jinja", "a") as f:
        f.write("{# a decode-only change #}\n")
    after = {v: render.inputs_sha256(v) for v in (prefill, split, merge)}
    assert after[prefill] == before[prefill]
    assert after[split] != before[split] and after[merge] != before[merge]
    with open(tmp_path / "templates" / "_attend.jinja", "a") as f:
        f.write("{# a shared change #}\n")
    shared = {v: render.inputs_sha256(v) for v in (prefill, split, merge)}
    assert shared[prefill] != after[prefill] and shared[split] != after[split]
    assert shared[merge] == after[merge], "the merge kernel does not render from _attend.jinja"
