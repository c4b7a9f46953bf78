"""The code layout docs/ARCHITECTURE.md describes holds: every module is in its module map
exactly once, and the installed library never imports the repository's tools or tests."""

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
