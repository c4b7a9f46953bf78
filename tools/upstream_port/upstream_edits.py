"""The edits the series makes to Megatron-LM's own files, found by their syntax (ast).

Each edit locates its place by what the code *is* (the ``scheduler_map`` assignment, the
``if scheduler_type == 'default_dynamic_cp'`` branch, the ``Literal`` of
``sequence_packing_scheduler`` ...), never by copied lines, and inserts code written here; the
diff's context lines are whatever the user's checkout holds. A place that cannot be found is an
``UpstreamLayoutError`` naming the file and what is missing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tools.upstream_port.sample_id_groups import SCHEDULER_NAME
from tools.upstream_port.vendor import LINE_LIMIT, PACKAGE, TEMPLATES

CLASS_NAME = "LptDynamicCPScheduler"
UPSTREAM_DYNAMIC = "default_dynamic_cp"  # upstream's dynamic-CP scheduler, kept as it is
SCHEDULER_FIELD = "sequence_packing_scheduler"
SCHEDULE_FILE = "megatron/core/datasets/data_schedule.py"
CONFIG_FILE = "megatron/core/model_parallel_config.py"
TRANSFORMER_CONFIG_FILE = "megatron/core/transformer/transformer_config.py"
ARGUMENTS_FILE = "megatron/training/arguments.py"
FIELD_DOC = f"{SCHEDULER_NAME}: Dynamic-CP scheduler balancing an estimated per-rank time."


class UpstreamLayoutError(ValueError):
    """The checkout lacks a place the series edits (a Megatron-LM version we do not know)."""


@dataclass(frozen=True)
class _Insert:
    """Text inserted at (line, column), both 0-based; ``drop`` characters replaced there."""

    line: int
    column: int
    text: str
    drop: int = 0


def _apply(text: str, inserts: list[_Insert]) -> str:
    lines = text.splitlines(keepends=True)
    for insert in sorted(inserts, key=lambda item: (item.line, item.column), reverse=True):
        if insert.line == len(lines):
            lines.append("")
        line = lines[insert.line]
        lines[insert.line] = (line[:insert.column] + insert.text
                              + line[insert.column + insert.drop:])
    return "".join(lines)


def _quote(text: str, node: ast.Constant) -> str:
    """The quote character the source uses for the string constant ``node``."""
    return text.splitlines()[node.lineno - 1][node.col_offset]


def _one(found: list, path: str, what: str):
    if len(found) != 1:
        raise UpstreamLayoutError(f"{path}: expected one {what}, found {len(found)}")
    return found[0]


def _template(name: str, indent: str = "") -> str:
    lines = (TEMPLATES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(indent + line if line.strip() else line for line in lines)


# --- megatron/core/datasets/data_schedule.py ------------------------------------------------

def _import_insert(tree: ast.Module, path: str) -> _Insert:
    """Our import, isort order among the module-level ``from megatron...`` imports."""
    ours = f"{PACKAGE}.sample_id_groups"
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("megatron.")]
    if not imports:
        raise UpstreamLayoutError(f"{path}: no module-level 'from megatron... import'")
    later = [node for node in imports if node.module > ours]
    line = later[0].lineno - 1 if later else imports[-1].end_lineno
    return _Insert(line, 0, _template("scheduler_imports.py.tmpl"))


def _scheduler_map(tree: ast.Module, path: str) -> ast.stmt:
    return _one([node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and "scheduler_map" in {getattr(target, "id", None) for target in
                                         getattr(node, "targets", [getattr(node, "target", None)])}
                 and isinstance(node.value, ast.Dict)], path, "'scheduler_map = {...}' dict")


def _map_entry_insert(text: str, node: ast.stmt, path: str) -> _Insert:
    mapping = node.value
    if not mapping.keys or text.splitlines()[mapping.end_lineno - 1].strip() != "}":
        raise UpstreamLayoutError(f"{path}: scheduler_map is not one entry per line")
    first = mapping.keys[0]
    quote = _quote(text, first)
    return _Insert(mapping.end_lineno - 1, 0,
                   f"{' ' * first.col_offset}{quote}{SCHEDULER_NAME}{quote}: {CLASS_NAME},\n")


def _is_name_eq(test: ast.expr, name: str, value: str) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == name and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == value)


def _kwargs_insert(text: str, tree: ast.Module, path: str) -> _Insert:
    """An ``elif`` for our scheduler after the branch that passes default_dynamic_cp's kwargs."""
    function = _one([node for node in tree.body if isinstance(node, ast.FunctionDef)
                     and node.name == "wrap_data_iterator"], path, "wrap_data_iterator()")
    branch = _one([node for node in ast.walk(function) if isinstance(node, ast.If)
                   and _is_name_eq(node.test, "scheduler_type", UPSTREAM_DYNAMIC)
                   and not node.orelse], path,
                  f"'if scheduler_type == {UPSTREAM_DYNAMIC!r}:' branch in wrap_data_iterator")
    quote = _quote(text, branch.test.comparators[0])
    outer, inner = " " * branch.col_offset, " " * branch.body[0].col_offset
    return _Insert(branch.end_lineno, 0,
                   f"{outer}elif scheduler_type == {quote}{SCHEDULER_NAME}{quote}:\n"
                   f"{inner}scheduler_kwargs[{quote}min_cp_size{quote}] = "
                   f"config.min_dynamic_context_parallel_size\n"
                   f"{inner}scheduler_kwargs[{quote}model_config{quote}] = config\n")


def edit_data_schedule(text: str, path: str = SCHEDULE_FILE) -> str:
    """Our import, the scheduler class before ``scheduler_map``, its entry, its kwargs."""
    tree = ast.parse(text)
    mapping = _scheduler_map(tree, path)
    if not any(isinstance(node, ast.ClassDef) and node.name == "DpBalancedScheduler"
               for node in tree.body):
        raise UpstreamLayoutError(f"{path}: no class DpBalancedScheduler")
    return _apply(text, [_import_insert(tree, path),
                         _Insert(mapping.lineno - 1, 0, _template("scheduler_class.py.tmpl")
                                 + "\n\n"),
                         _map_entry_insert(text, mapping, path),
                         _kwargs_insert(text, tree, path)])


# --- configuration and flags ----------------------------------------------------------------

def _relax_dynamic_check(text: str, tree: ast.Module, path: str) -> list[_Insert]:
    """``X.sequence_packing_scheduler != 'default_dynamic_cp'`` -> ``not in (both)``, and the
    error message under it names both."""
    branch = _one([node for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Compare)
                   and isinstance(node.test.left, ast.Attribute)
                   and node.test.left.attr == SCHEDULER_FIELD
                   and isinstance(node.test.ops[0], ast.NotEq)
                   and getattr(node.test.comparators[0], "value", None) == UPSTREAM_DYNAMIC],
                  path, f"'if ....{SCHEDULER_FIELD} != {UPSTREAM_DYNAMIC!r}:' check")
    test, constant = branch.test, branch.test.comparators[0]
    if test.left.end_lineno != constant.end_lineno:
        raise UpstreamLayoutError(f"{path}:{test.lineno}: the check spans several lines")
    quote = _quote(text, constant)
    both = f"{quote}{UPSTREAM_DYNAMIC}{quote}, {quote}{SCHEDULER_NAME}{quote}"
    inserts = [_Insert(test.lineno - 1, test.left.end_col_offset, f" not in ({both})",
                       drop=constant.end_col_offset - test.left.end_col_offset)]
    message = f"{SCHEDULER_FIELD}={UPSTREAM_DYNAMIC}"
    lines = text.splitlines()
    for index in range(branch.body[0].lineno - 1, branch.end_lineno):
        column = lines[index].find(message)
        if column >= 0:
            return inserts + [_Insert(index, column + len(message), f" or {SCHEDULER_NAME}")]
    raise UpstreamLayoutError(f"{path}:{branch.lineno}: no message naming {message}")


def _literal_insert(text: str, field: ast.AnnAssign, choices: list[ast.Constant],
                    path: str) -> _Insert:
    """Our name after the Literal's last choice; a line too long for upstream's limit is
    split the way black splits it (at the annotation's outer brackets)."""
    last = max(choices, key=lambda node: (node.lineno, node.col_offset))
    quote = _quote(text, last)
    line = text.splitlines()[field.lineno - 1]
    if field.lineno != field.end_lineno or field.value is None:
        return _Insert(last.end_lineno - 1, last.end_col_offset,
                       f", {quote}{SCHEDULER_NAME}{quote}")
    grown = (line[:last.end_col_offset] + f", {quote}{SCHEDULER_NAME}{quote}"
             + line[last.end_col_offset:])
    annotation = field.annotation
    if len(grown) <= LINE_LIMIT or not isinstance(annotation, ast.Subscript):
        return _Insert(field.lineno - 1, 0, grown, drop=len(line))
    indent = " " * field.col_offset
    shift = len(grown) - len(line)
    inner = grown[annotation.slice.col_offset:annotation.slice.end_col_offset + shift]
    split = (f"{grown[:annotation.value.end_col_offset]}[\n{indent}    {inner}\n"
             f"{indent}]{grown[annotation.end_col_offset + shift:]}")
    return _Insert(field.lineno - 1, 0, split, drop=len(line))


def _literal_inserts(text: str, tree: ast.Module, path: str) -> list[_Insert]:
    """Our name as the last choice of the field's ``Literal``, and a line in its docstring."""
    config = _one([node for node in tree.body if isinstance(node, ast.ClassDef)
                   and node.name == "ModelParallelConfig"], path, "class ModelParallelConfig")
    index, field = _one([(index, node) for index, node in enumerate(config.body)
                         if isinstance(node, ast.AnnAssign)
                         and getattr(node.target, "id", None) == SCHEDULER_FIELD], path,
                        f"{SCHEDULER_FIELD} field")
    choices = [node for node in ast.walk(field.annotation) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)]
    if UPSTREAM_DYNAMIC not in {node.value for node in choices}:
        raise UpstreamLayoutError(f"{path}: {SCHEDULER_FIELD}'s Literal has no "
                                  f"{UPSTREAM_DYNAMIC!r}")
    inserts = [_literal_insert(text, field, choices, path)]
    doc = config.body[index + 1] if index + 1 < len(config.body) else None
    lines = text.splitlines()
    if isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant):
        for line in range(doc.lineno - 1, doc.end_lineno):
            stripped = lines[line].lstrip()
            if stripped.startswith(f"{UPSTREAM_DYNAMIC}:"):
                indent = lines[line][:len(lines[line]) - len(stripped)]
                return inserts + [_Insert(line + 1, 0, f"{indent}{FIELD_DOC}\n")]
    raise UpstreamLayoutError(f"{path}: {SCHEDULER_FIELD}'s docstring has no "
                              f"'{UPSTREAM_DYNAMIC}:' line")


def edit_model_parallel_config(text: str, path: str = CONFIG_FILE) -> str:
    """The field accepts our name, documents it, and dynamic CP accepts it."""
    tree = ast.parse(text)
    return _apply(text, _literal_inserts(text, tree, path)
                  + _relax_dynamic_check(text, tree, path))


def edit_transformer_config(text: str, path: str = TRANSFORMER_CONFIG_FILE) -> str:
    """Our name joins ``supported_schedulers``."""
    tree = ast.parse(text)
    listing = _one([node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and getattr(node.targets[0], "id", None) == "supported_schedulers"
                    and isinstance(node.value, ast.List)], path, "supported_schedulers list")
    last = listing.elts[-1]
    quote = _quote(text, last)
    return _apply(text, [_Insert(last.end_lineno - 1, last.end_col_offset,
                                 f", {quote}{SCHEDULER_NAME}{quote}")])


def edit_arguments(text: str, path: str = ARGUMENTS_FILE) -> str:
    """``--dynamic-context-parallel`` accepts our scheduler too."""
    return _apply(text, _relax_dynamic_check(text, ast.parse(text), path))


def edit_file(checkout: Path, relative: str, edit) -> None:
    """Applies ``edit`` to one file of ``checkout`` (a missing file is an UpstreamLayoutError)."""
    path = checkout / relative
    if not path.is_file():
        raise UpstreamLayoutError(f"{relative} not found")
    path.write_text(edit(path.read_text(encoding="utf-8"), relative), encoding="utf-8")
