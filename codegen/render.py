"""Renders templates/*.py.jinja into the checked-in modules under codegen/generated/.

``python -m codegen render`` writes the modules whose content changed; ``python -m codegen
render --check`` writes nothing and exits 1 naming every module that differs from what the
templates produce now (CI runs it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import jinja2

from .variants import PAGE_SIZE, Variant, all_variants, get_arch

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE_DIR = REPO_ROOT / "templates"
GENERATED_DIR = pathlib.Path(__file__).resolve().parent / "generated"
# Bump when the renderer itself changes what it emits for unchanged templates (2: the input hash
# covers only the templates a variant renders from, no longer every template).
RENDERER_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Rendered:
    variant: Variant
    path: pathlib.Path
    text: str
    inputs_sha256: str


def _environment() -> jinja2.Environment:
    if not TEMPLATE_DIR.is_dir():
        raise FileNotFoundError(
            f"templates not found at {TEMPLATE_DIR}: rendering needs a source checkout (pip install -e .)"
        )
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, never empty text
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def template_params(variant: Variant) -> dict:
    """Everything a template may read: already-formatted values, no logic needed to place them."""
    spec = get_arch(variant.arch)
    params = {
        "arch": spec.name,
        "scale_mode": variant.scale_mode,
        "page_size": PAGE_SIZE,
        "use_pdl": spec.use_pdl,
        "amd_knobs": spec.amd_knobs,
        "fold_scales": variant.fold_scales,
    }
    if variant.kernel != "decode_merge":  # the kernels that read K/V pages
        params["kv_tma"] = spec.kv_tma
        params["v_cvt_asm"] = spec.fp8_cvt_asm  # kv_upcast 3 (configs.KV_UPCAST_MODES)
    return params


def template_sources(env: jinja2.Environment, name: str) -> list[str]:
    """`name` and every template it imports or includes, directly or not (sorted)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(_included(env, current))
    return sorted(seen)


def templates_sha256(names) -> str:
    """Hash of the named template files: a variant's hash moves only when a template it renders
    from changes (a decode-only change leaves the prefill modules, and their tuned configs, as they were)."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode())
        h.update((TEMPLATE_DIR / name).read_bytes())
    return h.hexdigest()


def inputs_sha256(variant: Variant, env: jinja2.Environment | None = None) -> str:
    env = env or _environment()
    h = hashlib.sha256()
    h.update(templates_sha256(template_sources(env, variant.template)).encode())
    h.update(json.dumps(template_params(variant), sort_keys=True).encode())
    h.update(f"renderer={RENDERER_VERSION}".encode())
    return h.hexdigest()


def _included(env: jinja2.Environment, name: str) -> list[str]:
    """The templates `name` imports or includes (directly), in the order they appear."""
    import jinja2.meta

    source = env.loader.get_source(env, name)[0]
    return [t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t]


def _header(variant: Variant, digest: str, env: jinja2.Environment) -> str:
    shared = ", ".join(f"templates/{t}" for t in _included(env, variant.template))
    return (
        "# GENERATED FILE - DO NOT EDIT. Regenerate with `python -m codegen render`.\n"
        f"# template: templates/{variant.template}{f' (with {shared})' if shared else ''}\n"
        f"# variant: {variant.name} (arch={variant.arch}, kernel={variant.kernel}, "
        f"scale_mode={variant.scale_mode}{'' if variant.fold_scales else ', unfolded baseline'})\n"
        f"# inputs-sha256: {digest}\n"
    )


def render(variant: Variant, env: jinja2.Environment | None = None) -> Rendered:
    env = env or _environment()
    digest = inputs_sha256(variant, env)
    body = env.get_template(variant.template).render(**template_params(variant))
    text = _header(variant, digest, env) + body.rstrip() + f"\n\nINPUTS_SHA256 = {digest!r}\n"
    return Rendered(variant, GENERATED_DIR / f"{variant.name}.py", text, digest)


def render_all() -> list[Rendered]:
    env = _environment()
    return [render(v, env) for v in all_variants()]


def write_all() -> list[pathlib.Path]:
    """Writes changed modules only (unchanged files keep their mtime); returns those written."""
    GENERATED_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for r in render_all():
        if not r.path.exists() or r.path.read_text() != r.text:
            r.path.write_text(r.text)
            written.append(r.path)
    return written


def drifted() -> list[str]:
    """Problems between committed modules and the templates, one line per file; empty when in sync."""
    problems = []
    expected = {r.path.name: r for r in render_all()}
    for name, r in sorted(expected.items()):
        if not r.path.exists():
            problems.append(f"{r.path}: missing (run `python -m codegen render`)")
        elif r.path.read_text() != r.text:
            problems.append(f"{r.path}: differs from templates/{r.variant.template} (run `python -m codegen render`)")
    for path in sorted(GENERATED_DIR.glob("*.py")):
        if path.name != "__init__.py" and path.name not in expected:
            problems.append(f"{path}: not produced by any template variant (delete it)")
    return problems
