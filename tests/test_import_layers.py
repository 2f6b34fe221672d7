"""The package's import direction: contract ← tasks ← {models, datasets} ← benchmarks ←
platform ← {testing, commands}; no cycles; the pure layers never load Ray Train/Tune or MLflow.

The graph is read from the source with ``ast`` (imports inside functions count too: a lazy
import is still a dependency), so the test needs nothing installed beyond the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from preloaded_python import fresh_python

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vlp"

# rank of each top-level room of vlp; a room may import rooms of lower rank only, and rooms
# of one rank never import each other
LAYERS = {"contract": 0, "tasks": 1, "models": 2, "datasets": 2, "benchmarks": 3,
          "platform": 4, "testing": 5, "commands": 5, "cli": 6}
PURE = ("contract", "tasks", "models", "datasets")
HEAVY = ("ray.train", "ray.tune", "mlflow")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _raw_imports(path: Path) -> set[str]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(vlp module → the vlp modules it imports, vlp module → every name it imports)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    graph, raw = {}, {}
    for name, path in files.items():
        raw[name] = _raw_imports(path)
        deps = set()
        for imported in raw[name]:
            while imported and imported not in files:
                imported = imported.rpartition(".")[0]
            # a module's own package (its __init__) is not a dependency of the module
            if imported and imported != name and not name.startswith(imported + "."):
                deps.add(imported)
        graph[name] = deps
    return graph, raw


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter; counter += 1
        stack.append(root); on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter; counter += 1
                    stack.append(child); on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop(); on_stack.discard(member); group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def against_the_order(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, deps in graph.items():
        here = _room(module)
        for dep in deps:
            there = _room(dep)
            if here in LAYERS and there in LAYERS and here != there \
                    and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{module} ({here}) imports {dep} ({there})")
    return sorted(wrong)


def test_the_package_has_no_import_cycle():
    graph, _ = import_graph()
    assert cycles(graph) == []


def test_imports_run_one_way_through_the_layers():
    graph, _ = import_graph()
    assert set(filter(None, map(_room, graph))) <= set(LAYERS), "a new room needs a layer"
    assert against_the_order(graph) == []


def test_pure_layers_name_no_ray_train_tune_or_mlflow():
    _, raw = import_graph()
    heavy = [f"{m} imports {i}" for m, names in raw.items() if _room(m) in PURE
             for i in names if i.startswith(HEAVY)]
    assert heavy == []


def test_pure_layers_load_no_ray_train_tune_or_mlflow():
    """Importing every module of the pure layers (what a Ray Data map or a model user does)
    loads none of the heavy libraries, not even through a dependency."""
    graph, _ = import_graph()
    modules = sorted(m for m in graph if _room(m) in PURE)
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(n for n in sys.modules if n.startswith({HEAVY!r})))\n")
    out = fresh_python(code, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_checks_catch_what_they_are_for():
    """The graph walk itself: a cycle and an upward import in a made-up graph are found."""
    graph = {"vlp.contract.a": {"vlp.models.b"}, "vlp.models.b": {"vlp.contract.a"},
             "vlp.tasks.c": set()}
    assert cycles(graph) == [["vlp.contract.a", "vlp.models.b"]]
    assert against_the_order(graph) == ["vlp.contract.a (contract) imports vlp.models.b (models)"]
    assert against_the_order({"vlp.models.x": {"vlp.datasets.y"}}) != []  # one rank, two rooms


@pytest.mark.parametrize("room", ["datasets"])
def test_datasets_root_holds_only_rooms(room):
    loose = sorted(p.name for p in (PACKAGE / room).glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 2, loose


def test_the_cli_parser_loads_no_model_code():
    """``vlp --help`` and every command's parser (the extractor list of ``vlp data extract``
    among them) load neither the backbone nor transformers: ``vlp.models`` loads its names on
    first use. Before, every ``vlp`` invocation paid ~3 CPU s for them (4.9 → 2.0 for
    ``--help``)."""
    code = ("import sys\n"
            "from vlp.cli import build_parser\n"
            "build_parser()\n"
            "print(sorted(n for n in ('transformers', 'vlp.models.backbone') if n in sys.modules))\n"
            "from vlp.models import create_model, TASKS\n"
            "print(create_model.__module__, 'transformers' in sys.modules)\n")
    out = fresh_python(code, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "vlp.models.factory True"]
