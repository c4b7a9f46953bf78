"""tools/upstream_port's parts: the test verdicts (baseline vs patched), the cover letter's
numbers (from results.json), the carried package's imports, the edits' one-line errors."""

import ast
import copy
import json
import textwrap

import pytest

from tools.upstream_port.benchmark_rows import RESULTS, compared_rows
from tools.upstream_port.cover_letter import cover_letter_body
from tools.upstream_port.upstream_edits import (
    UpstreamLayoutError,
    edit_arguments,
    edit_data_schedule,
    edit_model_parallel_config,
)
from tools.upstream_port.upstream_tests import compare, counts, parse_junit
from tools.upstream_port.vendor import PACKAGE, carried_modules, rewrite_imports

JUNIT = '''<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit_tests.test_a" name="test_ok"/>
<testcase classname="tests.unit_tests.test_a.TestGroup" name="test_cuda[2]">
  <failure message="ZeroDivisionError: integer modulo by zero">trace</failure></testcase>
<testcase classname="tests.unit_tests.test_a" name="test_te"><skipped message="no TE"/></testcase>
<testcase classname="tests.unit_tests.test_a" name="test_broken"/>
{extra}</testsuite></testsuites>'''
NEW = "tests/unit_tests/test_new.py"


def _junit(tmp_path, name, extra=""):
    path = tmp_path / name
    path.write_text(JUNIT.format(extra=extra))
    return parse_junit(path, ["tests/unit_tests/test_a.py", NEW])


def test_verdicts_compare_the_patched_tree_with_the_baseline(tmp_path):
    before = _junit(tmp_path, "before.xml")
    assert set(before) == {"tests/unit_tests/test_a.py::test_ok",
                           "tests/unit_tests/test_a.py::TestGroup::test_cuda[2]",
                           "tests/unit_tests/test_a.py::test_te",
                           "tests/unit_tests/test_a.py::test_broken"}
    after = _junit(tmp_path, "after.xml", extra=(
        '<testcase classname="tests.unit_tests.test_new" name="test_one"/>'
        '<testcase classname="tests.unit_tests.test_new" name="test_two">'
        '<failure message="AssertionError: no"/></testcase>'))
    after["tests/unit_tests/test_a.py::test_broken"] = after[
        "tests/unit_tests/test_a.py::TestGroup::test_cuda[2]"]  # a regression
    del after["tests/unit_tests/test_a.py::TestGroup::test_cuda[2]"]  # deselected
    rows = {row.test: row for row in compare(before, after, (NEW,))}
    assert rows["tests/unit_tests/test_a.py::test_ok"].verdict == "pass"
    assert rows["tests/unit_tests/test_a.py::test_broken"].verdict == "FAIL"
    cuda = rows["tests/unit_tests/test_a.py::TestGroup::test_cuda[2]"]
    assert cuda.verdict == "not run" and "ZeroDivisionError" in cuda.detail
    assert rows["tests/unit_tests/test_a.py::test_te"].detail.endswith("no TE")
    assert counts(list(rows.values()), new=False) == {"pass": 1, "FAIL": 1, "not run": 2}
    assert counts(list(rows.values()), new=True) == {"pass": 1, "FAIL": 1, "not run": 0}


def test_cover_letter_numbers_come_from_the_results():
    results = json.loads(RESULTS.read_text())
    letter = cover_letter_body(results, "megatron-varlen X", "0" * 40)
    rows = compared_rows(results)
    assert len(rows) == 20 and sum(row.label in letter for row in rows) == len(rows)
    assert "median 0.980x over 15 configurations" in " ".join(letter.split())
    changed = copy.deepcopy(results)
    for section in ("grid", "small_batches"):
        for value in changed[section].values():
            upstream = value["schedulers"].get("upstream_dynamic_cp", {})
            if "critical_path" in upstream:
                upstream["critical_path"] = value["schedulers"]["default_dynamic_cp"][
                    "critical_path"] * 2
    assert "median 0.500x over 15 configurations" in " ".join(
        cover_letter_body(changed, "X", "0" * 40).split())


def test_carried_modules_import_only_the_carried_package():
    modules = carried_modules()
    assert {"megatron.varlen.scheduling.dynamic_cp", "tools.upstream_port.fill_idle",
            "tools.upstream_port.sample_id_groups"} <= set(modules)
    assert "megatron.varlen.scheduling.registry" not in modules  # not needed upstream
    for module in modules:
        tree = ast.parse(rewrite_imports(module))
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert [name for name in imported if name.startswith(("megatron.", "tools."))
                and not name.startswith(PACKAGE + ".")] == []
    fill = rewrite_imports("tools.upstream_port.fill_idle")
    assert max(len(line) for line in fill.splitlines()) <= 100  # the long import was split


SCHEDULE = '''\
scheduler_map = {
    "dp_balanced": DpBalancedScheduler,
}


class DpBalancedScheduler:
    pass
'''


def test_edits_name_the_file_and_what_is_missing():
    with pytest.raises(UpstreamLayoutError, match=r"^x\.py: no module-level 'from megatron"):
        edit_data_schedule(SCHEDULE, "x.py")
    with pytest.raises(UpstreamLayoutError, match="expected one 'if ....sequence_packing_"):
        edit_arguments("def f(args):\n    return 1\n", "a.py")


def test_a_literal_too_long_for_the_line_is_split_like_black():
    text = textwrap.dedent('''\
        class ModelParallelConfig:
            sequence_packing_scheduler: Optional[Literal['dp_balanced', 'default_dynamic_cp']] = None
            """
            default_dynamic_cp: the dynamic one.
            """

            def __post_init__(self):
                if self.sequence_packing_scheduler != 'default_dynamic_cp':
                    raise ValueError('sequence_packing_scheduler=default_dynamic_cp')
        ''')
    edited = edit_model_parallel_config(text, "m.py")
    assert edited.splitlines()[1:4] == [
        "    sequence_packing_scheduler: Optional[",
        "        Literal['dp_balanced', 'default_dynamic_cp', 'lpt_dynamic_cp']",
        "    ] = None"]
    assert "    lpt_dynamic_cp: Dynamic-CP scheduler balancing" in edited
    assert "not in ('default_dynamic_cp', 'lpt_dynamic_cp'):" in edited
    assert "sequence_packing_scheduler=default_dynamic_cp or lpt_dynamic_cp" in edited
