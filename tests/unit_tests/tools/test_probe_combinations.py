"""tools/probe_combinations.py's bookkeeping (no training): the committed table reads back into
the same table, so a regeneration can merge the cells whose results files are not kept."""

from pathlib import Path

import pytest

from tools.probe_combinations import load_table, table

RESULTS = Path(__file__).resolve().parents[3] / "results" / "combinations"


@pytest.mark.parametrize("name", ["TABLE.md", "RESUME_LAYOUT_TABLE.md"])
def test_the_committed_table_reads_back_unchanged(name):
    """Its cells merge into a regenerated table (--merge TABLE.md), so it must round-trip
    (resume checks on another layout too: ``CELL+resume@LAYOUT``)."""
    text = (RESULTS / name).read_text()
    committed = text[text.index("| cell |"):].strip()
    regenerated = table(load_table(RESULTS / name))
    assert regenerated.split("\n\n", 1)[0] in text  # the counts line
    assert [line.rstrip() for line in regenerated.split("\n\n", 1)[1].splitlines()] == \
        [line.rstrip() for line in committed.splitlines()]
