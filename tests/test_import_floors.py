"""The floors of `kvcache`: imports flow down the stages, never up, and no module imports itself back.

FLOORS is the one statement of the stage order. Every import counts, a function-level or
TYPE_CHECKING one included: an import hidden in a function still ties the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvcache"

# Lowest first, as DESIGN.md stages them: the pure planning floors (configs, models, sizing, engine rules), then the
# torch floors (memory probing, pools, allocators, runtime, the configurator). "ground" is the modules directly in
# kvcache/ (errors, arithmetic, byte_units): they import nothing of kvcache but each other. engines/ (one engine
# version's rules) sits on sizing: each engine is an EngineRules (kvcache.sizing.engine_rules) over its layer specs.
# kvcache.testing (fakes for engines built on kvcache) sits on top.
FLOORS = ("ground", "inputs", "models", "sizing", "engines", "memory", "pools", "allocators", "runtime", "configurator",
          "testing")
FORBIDDEN_IN_KVCACHE = ("dependency_injector", "app", "containers")
# Planning: numbers in, plan out. These floors, and every module they import, import no torch (DESIGN.md: plans are
# data), so a plan or a capacity-planning service needs no GPU stack; a dtype there is kvcache.inputs.dtypes.DType.
PLANNING_FLOORS = ("ground", "inputs", "models", "sizing", "engines")
DEVICE_LIBRARIES = ("torch", "triton")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "ground"
    if len(parts) == 2 and parts[1] not in FLOORS:
        return "ground"
    return parts[1]


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_names(text: str, package: str) -> set[str]:
    """Every absolute module name a file in `package` imports, anywhere in it: `from a import b` gives a.b
    when that is a module (importing it runs a's __init__, as every import of a submodule does), else a."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.update(f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names)
    return names


def imports_of(path: Path) -> set[str]:
    module = module_name(path)
    return imported_names(path.read_text(), module if path.name == "__init__.py" else module.rpartition(".")[0])


def import_graph() -> dict[str, set[str]]:
    """kvcache module -> the kvcache modules it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {n for n in imports_of(p) if n in modules and n != m} for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_no_import_from_a_later_floor() -> None:
    upward = [f"{m} ({floor_of(m)}) imports {n} ({floor_of(n)})"
              for m, imports in sorted(import_graph().items()) for n in sorted(imports)
              if FLOORS.index(floor_of(n)) > FLOORS.index(floor_of(m))]
    assert upward == []


def test_kvcache_imports_neither_the_container_library_nor_the_app() -> None:
    offending = [f"{module_name(p)} imports {n}" for p in sorted(PACKAGE.rglob("*.py")) for n in sorted(imports_of(p))
                 if n.split(".")[0] in FORBIDDEN_IN_KVCACHE]
    assert offending == []


def reached_from(starts: list[str], graph: dict[str, set[str]]) -> set[str]:
    """Every kvcache module importing `starts` runs: what they import, transitively, and each one's packages."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts))] + sorted(graph.get(module, ()))
    return seen


def test_the_planning_floors_import_no_torch_not_even_through_another_module() -> None:
    graph = import_graph()
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    planning = reached_from([m for m in graph if floor_of(m) in PLANNING_FLOORS], graph)
    offending = [f"{m} imports {n}" for m in sorted(planning) for n in sorted(imports_of(paths[m]))
                 if n.split(".")[0] in DEVICE_LIBRARIES]
    assert offending == []


def test_reached_from_follows_imports_and_packages() -> None:
    graph = {"kvcache.sizing.a": {"kvcache.memory.b"}, "kvcache.memory.b": set(), "kvcache.memory.c": set()}
    assert reached_from(["kvcache.sizing.a"], graph) == {
        "kvcache", "kvcache.sizing", "kvcache.sizing.a", "kvcache.memory", "kvcache.memory.b"}


def test_the_planning_floors_lie_below_every_torch_floor() -> None:
    # DESIGN.md: numbers in, plan out first; memory, pools, allocators, runtime and the configurator (torch) on top
    assert FLOORS[:len(PLANNING_FLOORS)] == PLANNING_FLOORS


def test_every_stage_folder_is_a_floor() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(FLOORS), f"add {sorted(folders - set(FLOORS))} to FLOORS, in its place"


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_cycle_finder_finds_a_circle_and_only_a_circle(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_a_function_level_or_relative_import_counts() -> None:
    text = "def f():\n    from kvcache.sizing.planning import plan_pool_sizes\nfrom ..memory import memory_probe\n"
    assert imported_names(text, "kvcache.inputs") == {"kvcache.sizing.planning", "kvcache.memory.memory_probe"}


def test_every_name_imported_from_the_project_exists() -> None:
    # A function-level import runs only when its function does: one on a CUDA-only path (measured sizing, the
    # post-capture resize, graph capture) would break on the GPU long after CI, which has none, passed.
    import importlib

    missing = []
    for path in sorted([*ROOT.glob("kvcache/**/*.py"), *ROOT.glob("app/**/*.py"), *ROOT.glob("containers/*.py"),
                        *ROOT.glob("benchmarks/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in ("kvcache", "app", "containers")):
                continue
            module = importlib.import_module(node.module)
            missing += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                        if a.name != "*" and not hasattr(module, a.name) and not is_module(f"{node.module}.{a.name}")]
    assert missing == []


MAX_MODULE_LINES = 300  # a module one reads in one sitting; split where the job splits (issue 33)


def test_no_module_of_kvcache_or_app_is_over_300_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "app").rglob("*.py")])
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_import_circles_in_app_either() -> None:
    modules = {module_name(p): p for p in [*PACKAGE.rglob("*.py"), *(ROOT / "app").rglob("*.py"),
                                           *(ROOT / "containers").rglob("*.py")]}
    graph = {m: {n for n in imports_of(p) if n in modules and n != m} for m, p in modules.items()}
    assert cycles(graph) == []
