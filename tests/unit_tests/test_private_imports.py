"""The library imports no private name of megatron-core, except the ones listed here with why.

A private helper (a leading underscore) may change or vanish in any megatron-core release, so
each such import is a decision, written down below, not an accident. The scan reads every
module under megatron/ (the installed library) with ``ast``: ``from megatron.core... import
_name`` at any depth, imports inside functions included.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARY_ROOT = REPO / "megatron"
UPSTREAM_PACKAGE = "megatron.core"
# (our module, megatron-core's private name): why it is imported rather than written here.
ALLOWED = {
    ("megatron/varlen/attention/cp_switching.py", "_yarn_get_concentration_factor_from_config"):
        "the mscale megatron-core's own SelfAttention hands its RoPE (its attention.py imports "
        "it the same way); a copy of YaRN's config rules could drift from it silently",
}


def private_upstream_names(source: str) -> list[str]:
    """The private names ``source`` imports from megatron-core, in order."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module != UPSTREAM_PACKAGE and not node.module.startswith(UPSTREAM_PACKAGE + "."):
            continue
        names += [alias.name for alias in node.names if alias.name.startswith("_")]
    return names


def _library_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(LIBRARY_ROOT.rglob("*.py")):
        module = path.relative_to(REPO).as_posix()
        found.update((module, name) for name in private_upstream_names(path.read_text()))
    return found


def test_the_scan_sees_each_import_form():
    source = (
        "from megatron.core.models.common.embeddings.rope_utils import _rotate_half, public\n"
        "from megatron.core import (\n    _grouped as renamed,\n)\n"
        "def late():\n    from megatron.core.transformer import _inside\n"
        "from megatron.corefork import _other_package\n"
        "from megatron.varlen.packing import _ours\n"
        "from . import _relative\n"
    )
    assert private_upstream_names(source) == ["_rotate_half", "_grouped", "_inside"]


def test_only_the_listed_private_names_of_megatron_core_are_imported():
    found = _library_imports()
    unlisted = sorted(found - set(ALLOWED))
    assert not unlisted, (
        f"private megatron-core names imported: {unlisted}; write our own (tested against "
        f"megatron-core's public path) or list it in ALLOWED with the reason")
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"listed but no longer imported (remove from ALLOWED): {stale}"
