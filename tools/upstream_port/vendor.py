"""The carried module set: our scheduler's modules, rewritten for upstream's package path.

The patch carries the import closure of ``ROOTS`` (megatron/varlen/scheduling and the carried
modules of tools/upstream_port) as one flat package, ``PACKAGE``, inside Megatron-LM: each
module's text unchanged but for upstream's file header on top and its imports of our packages
pointing into ``PACKAGE``. So a change to our scheduler regenerates the patch with no edit here.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

PACKAGE = "megatron.core.datasets.lpt_dynamic_cp"
OUR_PACKAGES = ("megatron.varlen.scheduling", "tools.upstream_port")
# The interface module, and what the carried tests use beside it.
ROOTS = ("tools.upstream_port.sample_id_groups", "megatron.varlen.scheduling.dp_balanced",
         "megatron.varlen.scheduling.schedule_evaluation", "megatron.varlen.scheduling.validate")
TEMPLATES = Path(__file__).resolve().parent / "templates"
LINE_LIMIT = 100  # upstream's black and pylint line length
REPO = Path(__file__).resolve().parents[2]


class VendorError(ValueError):
    """Our own modules do not fit the carried-package rules (a developer's error)."""


def package_dir() -> str:
    """The carried package's directory inside a Megatron-LM checkout."""
    return PACKAGE.replace(".", "/")


def _source_path(module: str) -> Path:
    return REPO.joinpath(*module.split(".")).with_suffix(".py")


def _our_imports(module: str) -> list[ast.ImportFrom]:
    """``from <ours>.X import ...`` statements of ``module`` (lazy ones too)."""
    tree = ast.parse(_source_path(module).read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.startswith(OUR_PACKAGES)
                                                for alias in node.names):
            raise VendorError(f"{module}: 'import {node.names[0].name}' (carried modules "
                              "import ours as 'from <module> import <names>')")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OUR_PACKAGES):
            if node.module in OUR_PACKAGES:
                raise VendorError(f"{module}: imports the package {node.module} itself; import "
                                  "from its modules")
            found.append(node)
    return found


def carried_modules() -> list[str]:
    """The import closure of ``ROOTS``, sorted; every leaf name is unique."""
    seen, todo = set(), list(ROOTS)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [node.module for node in _our_imports(module)]
    leaves = [module.rsplit(".", 1)[1] for module in seen]
    clashes = sorted({leaf for leaf in leaves if leaves.count(leaf) > 1})
    if clashes:
        raise VendorError(f"carried modules share a name: {clashes}")
    return sorted(seen)


def _exploded(indent: str, module: str, node: ast.ImportFrom) -> str:
    """``from module import (`` one name a line, the way black and isort split an import."""
    names = [alias.name + (f" as {alias.asname}" if alias.asname else "") for alias in node.names]
    return (f"{indent}from {module} import (\n"
            + "".join(f"{indent}    {name},\n" for name in names) + f"{indent})\n")


def rewrite_imports(module: str) -> str:
    """``module``'s text with its imports of our packages pointing into ``PACKAGE``; a
    one-line import that the longer path pushes past the line limit is split."""
    lines = _source_path(module).read_text(encoding="utf-8").splitlines(keepends=True)
    for node in _our_imports(module):
        target = f"{PACKAGE}.{node.module.rsplit('.', 1)[1]}"
        index = node.lineno - 1
        old = f"from {node.module} import"
        if old not in lines[index]:
            raise VendorError(f"{module}:{node.lineno}: expected '{old}' on one line")
        lines[index] = lines[index].replace(old, f"from {target} import", 1)
        if node.end_lineno == node.lineno and len(lines[index].rstrip("\n")) > LINE_LIMIT:
            lines[index] = _exploded(" " * node.col_offset, target, node)
    return "".join(lines)


def file_header(first_line: str, year: int) -> str:
    """Upstream's copyright line (read from one of its files) with this file's year."""
    if not re.match(r"# Copyright \(c\) \d{4}\b", first_line):
        raise VendorError(f"unexpected file header {first_line.strip()!r}")
    return re.sub(r"\d{4}", str(year), first_line.strip(), count=1) + "\n\n"


def _summary(module: str) -> str:
    docstring = ast.get_docstring(ast.parse(_source_path(module).read_text(encoding="utf-8")))
    return (docstring or "").strip().splitlines()[0] if docstring else ""


def package_files(header: str, source: str) -> dict[str, str]:
    """Relative path -> text of every file of the carried package (``source`` names the
    commit it is generated from)."""
    modules = carried_modules()
    index = "\n".join(textwrap.fill(f"* ``{module.rsplit('.', 1)[1]}``: {_summary(module)}",
                                     LINE_LIMIT, subsequent_indent="  ") for module in modules)
    init = (TEMPLATES / "package_init.py.tmpl").read_text(encoding="utf-8")
    files = {f"{package_dir()}/__init__.py":
             header + init.replace("@SOURCE@", source).replace("@MODULES@", index)}
    for module in modules:
        text = rewrite_imports(module).rstrip("\n") + "\n"  # no blank line at the end
        files[f"{package_dir()}/{module.rsplit('.', 1)[1]}.py"] = header + text
    return files
