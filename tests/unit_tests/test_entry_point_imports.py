"""The entry points are light to import.

megatron-core's first checkpoint save on each rank (``torch_dist``: its file writer's result
queue, a ``multiprocessing`` Manager made with the 'spawn' method) starts a helper process that
runs the entry point's file again, as ``__mp_main__``, before the save can go on. Whatever the
file imports at its top is paid there once per rank: torch and megatron-core took 4 s (idle) to
11 s (4 ranks on 2 loaded cores) per first save. Imported the way that helper imports it
(``multiprocessing.spawn.import_main_path``), the file must leave both alone.

The entry points also read their flags before they import megatron-core: a bad flag (the
suite starts many such processes) ends the run after the torch import alone.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ["pretrain_gpt.py", "pretrain_mamba.py"]
# The suite's drivers that run pretrain_gpt.py's main() with a fault injected pay the same.
SAVING_TEST_DRIVERS = ["tests/unit_tests/reliability/fault_driver.py",
                       "tests/unit_tests/reliability/save_fault_driver.py"]
HEAVY_MODULES = ["torch", "megatron.core"]
IMPORT_TIMEOUT_S = 120


def _heavy_modules_after_spawn_import(script: Path) -> list[str]:
    code = (f"import json, sys\nfrom multiprocessing.spawn import import_main_path\n"
            f"import_main_path({str(script)!r})\n"
            f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S, env={"PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS + SAVING_TEST_DRIVERS)
def test_a_spawn_helper_importing_the_entry_point_imports_neither_torch_nor_megatron_core(
        entry_point):
    assert _heavy_modules_after_spawn_import(REPO / entry_point) == []


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_a_bad_flag_ends_the_run_before_megatron_core_is_imported(entry_point):
    code = (f"import json, runpy, sys\nsys.argv = [{entry_point!r}, '--lr', 'nan']\n"
            f"try:\n    runpy.run_path({entry_point!r}, run_name='__main__')\n"
            f"except SystemExit as end:\n"
            f"    print(json.dumps([end.code, 'megatron.core' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S,
                          env={"PYTHONPATH": str(REPO), "WORLD_SIZE": "1"})
    assert f"{entry_point}: error: " in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [2, False], proc.stderr


def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check itself: a script importing torch at its top is reported."""
    script = tmp_path / "heavy_entry.py"
    script.write_text("import torch\n\nif __name__ == '__main__':\n    pass\n")
    assert _heavy_modules_after_spawn_import(script) == ["torch"]
