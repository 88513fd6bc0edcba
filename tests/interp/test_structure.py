"""The project's import graph, read from the source with ast (nothing is imported): imports go one
way, templates -> codegen -> generated -> runtime, with the tuner (codegen.tuning, tune.py) and the
static gate (codegen.static) and the vLLM plugin (codegen.vllm_plugin) as clients of that stack and of one launch description
(codegen.shapes), never imported back; no module grows past ~400 lines without saying why."""
import ast
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_LINES = 400
RUNTIME = ("codegen.api", "codegen.loader", "codegen.modules")
# The tuner, the static gate and the vLLM plugin (with its import hook) use the runtime; it never uses them.
CLIENT_PACKAGES = ("codegen.tuning", "codegen.static", "codegen.vllm_plugin", "codegen.vllm_hook")


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted name -> (file, is a package's __init__) for codegen/ and tune.py."""
    found = {}
    for path in sorted((REPO / "codegen").rglob("*.py")) + [REPO / "tune.py"]:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _imports(name: str, path: pathlib.Path, package: bool, modules) -> set[str]:
    """The project modules `name` imports anywhere in its file (a function's lazy import counts)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if package else name.split(".")[:-1]
                base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:  # `from package import module`
                    out.add(full)
                elif base in modules:
                    out.add(base)
    return out - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, package, modules) for name, (path, package) in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _collapsed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with every subpackage of codegen as one node (codegen.tuning.*, codegen.static.*, ...)."""
    def unit(name):
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 and parts[0] == "codegen" else name

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        out.setdefault(unit(name), set()).update(unit(t) for t in targets)
    return {name: targets - {name} for name, targets in out.items()}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _reachable(graph, start) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "codegen.modules" in graph["codegen.api"] and "codegen.modules" in graph["codegen.loader"]
    assert "codegen.static" in graph["codegen.tuning.trial"]  # a lazy import inside a function counts
    assert "codegen.tuning.status" in graph["tune"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_modules():
    assert _cycles(_graph()) == []


def test_no_import_cycle_among_packages():
    # e.g. codegen.static -> codegen.tuning.buckets while codegen.tuning.trial -> codegen.static
    assert _cycles(_collapsed(_graph())) == []


def test_the_runtime_never_imports_its_clients():
    graph = _graph()
    below = _reachable(graph, RUNTIME)
    assert not [m for m in below if any(_within(m, p) for p in CLIENT_PACKAGES) or m == "tune"], sorted(below)


def test_the_static_gate_imports_neither_the_runtime_api_nor_the_tuner():
    graph = _graph()
    static = [m for m in graph if _within(m, "codegen.static")]
    bad = {m: sorted(t for t in graph[m] if t in ("codegen.api", "codegen.loader", "tune")
                     or _within(t, "codegen.tuning")) for m in static}
    assert not {m: t for m, t in bad.items() if t}


def test_importing_the_static_gate_loads_neither_the_runtime_api_nor_the_tuner():
    """Also through the package: codegen/__init__ imports its public names on first use only."""
    code = ("import sys, codegen.static; print(sorted(m for m in sys.modules if m in ('codegen.api', "
            "'codegen.loader', 'optuna') or m.startswith('codegen.tuning')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_generated_modules_import_nothing_of_the_project():
    graph = _graph()
    generated = {m: sorted(t) for m, t in graph.items() if _within(m, "codegen.generated") and t}
    assert not generated


def test_no_module_over_400_lines_without_a_reason():
    """A long module says why in its docstring, in words containing "400 lines"."""
    long = []
    for name, (path, _) in _modules().items():
        text = path.read_text()
        lines = len(text.splitlines())
        doc = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and "400 lines" not in doc:
            long.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not long, long
