"""No module of our library shares its dotted name with one of upstream's.

A Megatron-LM checkout and megatron-core wheels from 0.17 on ship ``megatron/training/``; had
ours the same dotted names, whichever comes first on the path would silently shadow the other.
The list of upstream names (tests/unit_tests/data/upstream_module_names.txt) was
taken from megatron-core 0.16.1-0.19.2 and Megatron-LM main; refresh it when either moves. The
entry scripts (pretrain_gpt.py, pretrain_mamba.py keep Megatron-LM's names on purpose) and the
repository-only packages tests/ and tools/ are not installed and not checked.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_NAMES = REPO / "tests" / "unit_tests" / "data" / "upstream_module_names.txt"
LIBRARY_ROOT = REPO / "megatron"


def _upstream() -> set[str]:
    lines = UPSTREAM_NAMES.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def our_modules() -> set[str]:
    """Every dotted module and package name under megatron/ in this repository."""
    names = set()
    for path in LIBRARY_ROOT.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        names.update(".".join(parts[:i]) for i in range(2, len(parts)))  # the packages
    return names - {"megatron"}  # the shared namespace itself


def test_the_upstream_list_is_real():
    upstream = _upstream()
    assert len(upstream) > 500 and "megatron.core.parallel_state" in upstream
    assert "megatron.training.arguments" in upstream  # the collision once in our tree


def test_no_module_name_is_upstreams():
    mine = our_modules()
    assert {"megatron.varlen", "megatron.varlen_training", "megatron.wrap"} <= mine
    assert sorted(mine & _upstream()) == []
