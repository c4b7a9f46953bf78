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


# megatron.varlen's public API: its subpackages' __init__. The training layer, the
# facade and the entry points import from these, never from a module inside them.
VARLEN_SUBPACKAGES = ("attention", "mamba", "model", "packing", "platform", "scheduling")
VARLEN_CLIENTS = ("megatron/varlen_training", "megatron/wrap", "pretrain_gpt.py",
                  "pretrain_mamba.py")
# Package plumbing beside the subpackages, not feature API: the training layer's and the
# facade's own lazily exporting packages build their __getattr__ with it, as the subpackages do.
VARLEN_PLUMBING = ("lazy_exports",)


def _varlen_import_problem(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] != ["megatron", "varlen"] or ".".join(parts[2:]) in VARLEN_PLUMBING:
        return None
    if len(parts) != 3 or parts[2] not in VARLEN_SUBPACKAGES:
        return f"{name} is not a megatron.varlen subpackage ({', '.join(VARLEN_SUBPACKAGES)})"
    return None


def test_varlen_is_imported_through_its_subpackages():
    offenders = []
    for client in VARLEN_CLIENTS:
        root = REPO / client
        paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in paths:
            for name in _imported_modules(ast.parse(path.read_text())):
                problem = _varlen_import_problem(name)
                if problem:
                    offenders.append(f"{path.relative_to(REPO)}: {problem}")
    assert offenders == []


def test_the_varlen_import_rule_can_fail():
    assert _varlen_import_problem("megatron.varlen.packing") is None
    assert _varlen_import_problem("megatron.varlen.packing.data_schedule")
    assert _varlen_import_problem("megatron.varlen.cpu_device")
    assert _varlen_import_problem("megatron.varlen.lazy_exports") is None
    assert _varlen_import_problem("megatron.varlen.lazy_exports.lazy_exports")
    assert _varlen_import_problem("megatron.core.packed_seq_params") is None


def _subpackage_graph() -> dict[str, set[str]]:
    """Which megatron.varlen subpackage imports which, lazy (in-function) imports included."""
    graph = {sub: set() for sub in VARLEN_SUBPACKAGES}
    for sub in VARLEN_SUBPACKAGES:
        for path in sorted((REPO / "megatron" / "varlen" / sub).rglob("*.py")):
            for name in _imported_modules(ast.parse(path.read_text())):
                parts = name.split(".")
                if parts[:2] == ["megatron", "varlen"] and len(parts) > 2 and parts[2] != sub:
                    graph[sub].add(parts[2])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path, or None (depth-first search with colours)."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_varlen_subpackages_depend_one_way():
    graph = _subpackage_graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    assert graph["scheduling"] == set()  # pure: imports nothing of ours
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


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


def _from_import_targets(node: ast.ImportFrom, package: list[str], known) -> set[str]:
    """The modules a ``from ... import`` names: ``base.name`` where that is a known module,
    else ``base`` (relative imports resolved against ``package``)."""
    base = node.module or ""
    if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names}


def _imports_of(name: str, path: Path, known) -> set[str]:
    """The library modules ``name`` imports anywhere in its file: ``from pkg import sub`` names
    the submodule when there is one, else the package; relative imports are resolved. A package
    ``__init__`` that exports names lazily (lazy_exports.py) imports every module it names."""
    found = set()
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if is_package and isinstance(node, ast.Constant) and node.value in known:
            found.add(node.value)  # a lazily exported module
        elif isinstance(node, ast.ImportFrom):
            found |= _from_import_targets(node, package, known)
        elif isinstance(node, (ast.Import, ast.Call)):  # import x; importlib.import_module("x")
            found |= set(_imported_modules(node))
    return {module for module in found if module in known and module != name}


def test_no_import_cycle_in_the_library():
    known = _library_modules()
    graph = {name: _imports_of(name, path, known) for name, path in known.items()}
    assert graph["megatron.varlen_training.training"], "the scan found the loop's imports"
    assert "megatron.varlen.packing.data_schedule" in graph["megatron.varlen.packing"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_module_scan_sees_lazy_imports_and_lazy_exports(tmp_path):
    module = tmp_path / "x.py"
    module.write_text("def f():\n    from megatron.varlen_training import flops\n")
    known = {"megatron.varlen_training", "megatron.varlen_training.flops"}
    assert _imports_of("x", module, known) == {"megatron.varlen_training.flops"}
    package = tmp_path / "__init__.py"
    package.write_text('_EXPORTS = {"flops": "megatron.varlen_training.flops"}\n')
    assert _imports_of("p", package, known) == {"megatron.varlen_training.flops"}



def _import_time_imports(name: str, path: Path, known) -> set[str]:
    """The library modules Python runs while it imports ``name``: its top-level import
    statements (not those inside functions, nor names a package exports lazily) and, for each
    module they name, the packages above it, whose ``__init__`` runs first (not ``name``'s own
    packages: they are already being imported)."""
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    named = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            named |= _from_import_targets(node, package, known)
        elif isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
    parts = name.split(".")
    own_packages = {".".join(parts[:i]) for i in range(1, len(parts))}
    with_packages = {".".join(module.split(".")[:i]) for module in named
                     for i in range(1, module.count(".") + 2)}
    return {module for module in with_packages
            if module in known and module != name and module not in own_packages}


def test_no_import_time_cycle_through_a_package_init():
    """A package whose modules import one another's (checkpoint/ and resume/) must not import
    its modules eagerly from its __init__: importing a resume module first would run
    checkpoint/__init__, the load path, and back into the half-imported resume module
    (ImportError). Lazy exports (lazy_exports.py) keep such an __init__ import-free."""
    known = _library_modules()
    graph = {name: _import_time_imports(name, path, known) for name, path in known.items()}
    assert "megatron.varlen_training.checkpoint" in graph[
        "megatron.varlen_training.resume.run_args_record"], "the scan adds the package step"
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_import_time_scan_sees_a_package_init(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from p.a import f\n")
    module = tmp_path / "b.py"
    module.write_text("from q.c import g\ndef h():\n    from p.a import f\n")
    known = {"p", "p.a", "p.b", "q", "q.c"}
    assert _import_time_imports("p", init, known) == {"p.a"}
    assert _import_time_imports("p.b", module, known) == {"q", "q.c"}  # not p, not p.a


# The line width the code keeps (docs/ARCHITECTURE.md "Tests"); tests/ is not held to it
# yet (some long test lines remain).
MAX_COLUMNS = 100


def _long_lines(paths) -> list[str]:
    return [f"{path}:{number}: {len(line)} columns"
            for path in paths
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if len(line) > MAX_COLUMNS]


def test_library_and_tools_lines_fit_the_width():
    paths = [*(REPO / "megatron").rglob("*.py"), *(REPO / "tools").rglob("*.py"),
             *REPO.glob("*.py")]
    assert len(paths) > 200
    assert _long_lines(sorted(paths)) == []


def test_the_width_check_sees_a_long_line(tmp_path):
    wide = tmp_path / "wide.py"
    wide.write_text("x = 1\n" + "#" * MAX_COLUMNS + "\n" + "#" * (MAX_COLUMNS + 1) + "\n")
    assert _long_lines([wide]) == [f"{wide}:3: {MAX_COLUMNS + 1} columns"]
