"""The code layout docs/ARCHITECTURE.md describes holds: every module is in its module map
exactly once, the installed library never imports the repository's tools or tests, and no
import cycle joins its modules (imports inside functions included)."""

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
MAPPED_ROOTS = ("megatron", "tools", "tests/harness")
LIBRARY_PACKAGES = ("megatron/varlen_training", "megatron/varlen", "megatron/wrap")
OUTSIDE_THE_LIBRARY = ("tools", "tests")
MODULE_MAP = re.compile(r"^## Module map\n(.*?)(?=^## )", re.S | re.M)
LISTED_MODULE = re.compile(r"^\| `([\w/]+\.py)` \|", re.M)  # first column of a row


def _modules(root: str) -> list[str]:
    return sorted(path.relative_to(REPO).as_posix() for path in (REPO / root).rglob("*.py")
                  if path.name != "__init__.py" and "__pycache__" not in path.parts)


def _listed() -> Counter:
    section = MODULE_MAP.search(ARCHITECTURE.read_text())
    assert section, "docs/ARCHITECTURE.md lost its '## Module map' section"
    return Counter(LISTED_MODULE.findall(section.group(1)))


def test_every_module_is_in_the_architecture_module_map_once():
    listed = _listed()
    modules = [module for root in MAPPED_ROOTS for module in _modules(root)]
    assert len(modules) > 100  # the walk found the packages
    assert [module for module in modules if module not in listed] == [], "missing in the map"
    assert [module for module, count in listed.items() if count > 1] == [], "listed twice"
    assert [module for module in listed if not (REPO / module).is_file()] == [], "stale entry"


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.append(str(node.args[0].value))  # importlib.import_module("...")
    return names


def test_the_library_never_imports_tools_or_tests():
    offenders = []
    for package in LIBRARY_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in _imported_modules(ast.parse(path.read_text())):
                if name.split(".")[0] in OUTSIDE_THE_LIBRARY:
                    offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert offenders == []


def test_the_import_scan_sees_each_import_form():
    code = ("import tests.harness\nfrom tools.scheduling import simulate\n"
            "importlib.import_module('tests.x')\nfrom . import sibling\n")
    assert _imported_modules(ast.parse(code)) == ["tests.harness", "tools.scheduling",
                                                  "tests.x"]


# --- import cycles --------------------------------------------------------------------------


def _library_modules() -> dict[str, Path]:
    """Dotted name -> file of every module and package under megatron/ in this repository."""
    found = {}
    for path in (REPO / "megatron").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports_of(name: str, path: Path, known) -> set[str]:
    """The library modules ``name`` imports anywhere in its file: ``from pkg import sub`` names
    the submodule when there is one, else the package; relative imports are resolved."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                      for alias in node.names}
        elif isinstance(node, (ast.Import, ast.Call)):  # import x; importlib.import_module("x")
            found |= set(_imported_modules(node))
    return {module for module in found if module in known and module != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_in_the_library():
    known = _library_modules()
    graph = {name: _imports_of(name, path, known) for name, path in known.items()}
    assert graph["megatron.varlen_training.training"], "the scan found the loop's imports"
    assert _cycles(graph) == []


def test_the_cycle_scan_sees_a_lazy_cycle(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    module = tmp_path / "x.py"
    module.write_text("def f():\n    from megatron.varlen_training import flops\n")
    known = {"megatron.varlen_training", "megatron.varlen_training.flops"}
    assert _imports_of("x", module, known) == {"megatron.varlen_training.flops"}
