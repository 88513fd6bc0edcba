"""codegen.vllm_hook on a made-up package shaped like vLLM's MiniMax-M3 tree: the package __init__
imports the model, which imports the attention module, which imports the kernel by name (and
under an alias) from an ops module. The whole vLLM package cannot be imported on the CPU test
machine (torchvision), so this is where the nested import order of a real server is checked."""
import importlib
import inspect
import sys
import textwrap

import pytest

from codegen.vllm_hook import PackagePatcher

FILES = {
    "__init__.py": "from .model import Model\n",
    "model.py": "from .attn import forward\n\nclass Model:\n    run = staticmethod(forward)\n",
    "attn.py": "from .ops.k import kern, kern as other_name\n\ndef forward():\n    return kern()\n",
    "ops/__init__.py": "from .k import kern\n",
    "ops/k.py": "def kern():\n    return 'original'\n\ndef untouched():\n    return 1\n",
}


@pytest.fixture
def package(tmp_path, request):
    name = f"fakepkg_{request.node.name}"
    for rel, text in FILES.items():
        path = tmp_path / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def _patcher(package, asked):
    def replace(attr, original):
        asked.append((attr, original.__module__))

        def kern():
            return "replaced"

        kern.original = original
        return kern

    return PackagePatcher(package, ("kern",), replace)


def test_modules_imported_later_are_patched_in_nested_order(package):
    asked = []
    patcher = _patcher(package, asked)
    patcher.install()
    try:
        pkg = importlib.import_module(package)
    finally:
        patcher.uninstall()
    attn, ops, k = (sys.modules[f"{package}.{m}"] for m in ("attn", "ops", "ops.k"))
    assert pkg.Model.run() == "replaced"  # through the name the attention module bound at import
    assert attn.kern is attn.other_name is ops.kern is k.kern  # one replacement everywhere, aliases too
    assert k.kern.original.__module__ == f"{package}.ops.k" and k.untouched() == 1
    assert asked == [("kern", f"{package}.ops.k")]  # asked once per original
    holders = {(m, a) for m, a, _ in patcher.holders()}
    assert holders == {(f"{package}.{m}", a) for m, a in
                       (("attn", "kern"), ("attn", "other_name"), ("ops", "kern"), ("ops.k", "kern"))}
    # The modules keep their real loader: source lookups work as without the hook.
    assert type(k.__loader__).__name__ == "SourceFileLoader" and k.__spec__.loader is k.__loader__
    assert "def untouched" in inspect.getsource(k)


def test_modules_imported_before_are_patched_on_install(package):
    importlib.import_module(package)
    attn = sys.modules[f"{package}.attn"]
    assert attn.forward() == "original"
    patcher = _patcher(package, [])
    patcher.install()
    patcher.uninstall()
    assert attn.forward() == "replaced" and attn.other_name is attn.kern


def test_a_replace_that_declines_leaves_the_original(package):
    patcher = PackagePatcher(package, ("kern",), lambda attr, original: None)
    patcher.install()
    try:
        pkg = importlib.import_module(package)
    finally:
        patcher.uninstall()
    assert pkg.Model.run() == "original"
