"""Rules of the scheduling code, checked on its source (AST), so they hold as it changes:

* tests use only public scheduler names: no ``module._name`` of a scheduling module (the
  library's or the tools'), no ``from ... import _name`` from one, no monkeypatching of an
  underscore name on one (implementation details stay free to change);
* the package's import graph, lazy imports inside functions included, has no cycle;
* the cost formula lives in cost_model.py only: no other module of the library or of
  tools/scheduling reads a coefficient (a, b, g, d), writes the ring fraction (c - 1) / c or
  solves the quadratic (a square root); cost_model.py writes the fraction once;
* one LPT: lpt.py is the one priority queue of blocks by load (cover.py's max-heap grows the
  slowest block; it places nothing), and the package stays within its line budget.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
PACKAGE = REPO / "megatron" / "varlen" / "scheduling"
TOOLS = REPO / "tools" / "scheduling"
SCHEDULING_PACKAGES = {"megatron.varlen.scheduling": PACKAGE, "tools.scheduling": TOOLS}
COEFFICIENTS = {"a", "b", "g", "d"}
# 2,400 until the sliding window: its squared tokens (attention_area.py) and their price
# (CostModel.window) added the lines above it.
LINE_BUDGET = 2470
HEAP_USERS = {"cover.py"}  # slowest block first, for growth: not a placement


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _scheduling_package(module: str | None) -> str | None:
    return next((package for package in SCHEDULING_PACKAGES
                 if module and (module == package or module.startswith(package + "."))), None)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def private_uses(tree: ast.AST) -> list[str]:
    """Every touch of a private name of a scheduling module in ``tree`` (module docstring)."""
    bound, found = set(), []  # names bound to scheduling modules or their objects
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _scheduling_package(node.module):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"from {node.module} import {alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _scheduling_package(alias.name) and alias.asname:
                    bound.add(alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _dotted(node.value)
            if owner in bound or _scheduling_package(owner):
                found.append(f"{owner}.{node.attr}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "setattr" \
                and _dotted(node.func.value) == "monkeypatch" and node.args:
            target = node.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                if _scheduling_package(target.value) and _private(target.value.split(".")[-1]):
                    found.append(f"monkeypatch.setattr({target.value!r})")
            elif len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and _private(str(node.args[1].value)) and _dotted(target) in bound:
                found.append(f"monkeypatch.setattr({_dotted(target)}, {node.args[1].value!r})")
    return found


def test_tests_touch_no_private_scheduler_name():
    offenders = [f"{path.relative_to(REPO)}: {use}"
                 for path in sorted((REPO / "tests").rglob("*.py"))
                 for use in private_uses(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_private_name_scan_sees_each_form():
    code = ("from megatron.varlen.scheduling import packing, _hidden\n"
            "from tools.scheduling.bounds import price_table as table\n"
            "import megatron.varlen.scheduling.front as front\n"
            "packing._fill(1)\nfront._open\ntable._cache\n"
            "megatron.varlen.scheduling.holes._fit\n"
            "monkeypatch.setattr(packing, '_x', 1)\n"
            "monkeypatch.setattr('megatron.varlen.scheduling.polish._y', 2)\n"
            "packing.pack_sequences\nother._private\npacking.__file__\n")
    assert sorted(private_uses(ast.parse(code))) == sorted([
        "from megatron.varlen.scheduling import _hidden", "packing._fill", "front._open",
        "table._cache", "megatron.varlen.scheduling.holes._fit",
        "monkeypatch.setattr(packing, '_x')",
        "monkeypatch.setattr('megatron.varlen.scheduling.polish._y')"])


def _imported(node: ast.AST, name: str, modules: set[str]) -> list[str]:
    """The dotted modules an import statement loads (a package's submodule when it names one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: the package itself (a flat package)
        base = f"{name}.{node.module}" if node.module else name
    return [f"{base}.{alias.name}" if base == name and alias.name in modules else base
            for alias in node.names]


def import_graph(package: Path, name: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, anywhere in its code ("__init__" for
    names taken from the package itself)."""
    modules = {path.stem for path in package.glob("*.py")}
    graph = {}
    for path in package.glob("*.py"):
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, name, modules):
                if target == name:
                    edges.add("__init__")
                elif target.startswith(name + "."):
                    edges.add(target[len(name) + 1:].split(".")[0])
        graph[path.stem] = edges - {path.stem}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_scheduling_package_has_no_import_cycle():
    graph = import_graph(PACKAGE, "megatron.varlen.scheduling")
    assert graph["dynamic_cp"] >= {"packing", "polish", "pricing"}  # the scan sees imports
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_search_finds_a_lazy_import_cycle(tmp_path):
    (tmp_path / "first.py").write_text("from pkg.second import thing\n")
    (tmp_path / "second.py").write_text("def thing():\n    from pkg import first\n")
    (tmp_path / "third.py").write_text("import os\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) == ["first", "second", "first"]


def _formula_shapes(path: Path) -> tuple[list[str], int]:
    """(coefficient reads and square roots, ring fractions (x - 1) / x) in ``path``'s code."""
    reads, fractions = [], 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in COEFFICIENTS:
            reads.append(f"{_dotted(node) or node.attr} (line {node.lineno})")
        if isinstance(node, ast.Attribute) and node.attr == "sqrt":
            reads.append(f"{_dotted(node)} (line {node.lineno})")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for part in ast.walk(node.left):
                if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Sub) \
                        and isinstance(part.right, ast.Constant) and part.right.value == 1 \
                        and ast.dump(part.left) == ast.dump(node.right):
                    fractions += 1
    return reads, fractions


def test_the_cost_formula_lives_in_the_cost_model_only():
    fractions = {}
    for path in sorted([*PACKAGE.glob("*.py"), *TOOLS.glob("*.py"),
                        REPO / "megatron" / "varlen" / "packing" / "data_schedule.py"]):
        reads, count = _formula_shapes(path)
        if path.name == "cost_model.py":
            assert count == 1, "t(P, c) is written once, for scalars and arrays alike"
            continue
        assert reads == [], f"{path.relative_to(REPO)} computes cost itself: {reads}"
        fractions[path.name] = count
    assert sum(fractions.values()) == 0, {name: n for name, n in fractions.items() if n}


def _imports_heapq(path: Path) -> bool:
    return any(module == "heapq" for node in ast.walk(ast.parse(path.read_text()))
               for module in _imported(node, "", set()))


def test_one_lpt_and_the_line_budget():
    heap_users = {path.name for path in PACKAGE.glob("*.py") if _imports_heapq(path)}
    assert heap_users <= HEAP_USERS, f"a second priority queue of blocks: {heap_users}"
    lines = sum(len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py"))
    assert lines <= LINE_BUDGET, f"megatron/varlen/scheduling has {lines} lines"
