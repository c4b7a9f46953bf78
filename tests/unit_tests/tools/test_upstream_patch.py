"""tools/upstream_patch.py against a minimal fake Megatron-LM tree (written here: upstream's
file layout and the syntactic places the series edits, none of upstream's code; no mirror, no
network). The series is generated twice (byte-identical), applies with git am, its context
lines are the tree's own, and the patched tree imports, schedules and passes the series' core
tests."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.upstream_patch import main

REPO = Path(__file__).resolve().parents[3]
MARKER = "# fake-tree context line"
FAKE_FILES = {
    "megatron/core/__init__.py": "",
    "megatron/core/datasets/__init__.py": "",
    "megatron/core/transformer/__init__.py": "",
    "megatron/training/__init__.py": "",
    "megatron/core/datasets/data_schedule_utils.py": "def helper():\n    return None\n",
    "megatron/core/datasets/data_schedule.py": f'''\
        # Copyright (c) 2025, Fake Tree. All rights reserved.
        from typing import Dict, Type

        from megatron.core.datasets.data_schedule_utils import helper


        class BasePackingScheduler:
            def __init__(self, max_seqlen_per_dp_cp_rank, cp_size, dp_size,
                         microbatch_group_size_per_vp_stage, max_num_seqs=None):
                self.max_seqlen_per_dp_cp_rank = max_seqlen_per_dp_cp_rank
                self.cp_size, self.dp_size = cp_size, dp_size
                self.microbatch_group_size_per_vp_stage = microbatch_group_size_per_vp_stage
                self.max_num_seqs = max_num_seqs


        class DpBalancedScheduler(BasePackingScheduler):
            is_dynamic_cp = False


        class DefaultDynamicCPScheduler(DpBalancedScheduler):
            def __init__(self, *args, min_cp_size=1, **kwargs):
                super().__init__(*args, **kwargs)


        scheduler_map: Dict[str, Type[BasePackingScheduler]] = {{
            "dp_balanced": DpBalancedScheduler,
            "default_dynamic_cp": DefaultDynamicCPScheduler,
        }}


        def wrap_data_iterator(config, dp_size, cp_size):
            scheduler_type = config.sequence_packing_scheduler
            scheduler_kwargs = {{}}
            if scheduler_type == 'default_dynamic_cp':
                scheduler_kwargs['min_cp_size'] = config.min_dynamic_context_parallel_size
            {MARKER}
            return scheduler_map[scheduler_type](
                config.max_seqlen_per_dp_cp_rank, cp_size, dp_size, None, **scheduler_kwargs)
        ''',
    "megatron/core/model_parallel_config.py": '''\
        from dataclasses import dataclass
        from typing import Literal, Optional


        @dataclass
        class ModelParallelConfig:
            dynamic_context_parallel: bool = False
            sequence_packing_scheduler: Optional[Literal['dp_balanced', 'default_dynamic_cp']] = None
            """
            The packing scheduler.
            default_dynamic_cp: the dynamic one.
            """

            def __post_init__(self):
                if self.dynamic_context_parallel:
                    if self.sequence_packing_scheduler is None:
                        self.sequence_packing_scheduler = 'default_dynamic_cp'
                    if self.sequence_packing_scheduler != 'default_dynamic_cp':
                        raise ValueError('sequence_packing_scheduler=default_dynamic_cp')
        ''',
    "megatron/core/transformer/transformer_config.py": '''\
        def supported(name):
            supported_schedulers = ['dp_balanced', 'default_dynamic_cp']
            return name in supported_schedulers
        ''',
    "megatron/training/arguments.py": '''\
        def validate_args(args):
            if args.dynamic_context_parallel:
                if args.sequence_packing_scheduler != 'default_dynamic_cp':
                    raise ValueError('sequence_packing_scheduler=default_dynamic_cp')
        ''',
}
PATCHED_CHECK = '''
from types import SimpleNamespace
import megatron.core.datasets.lpt_dynamic_cp as package
from megatron.core.datasets.data_schedule import LptDynamicCPScheduler, scheduler_map
from megatron.core.datasets.data_schedule import wrap_data_iterator
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.transformer.transformer_config import supported
from megatron.training.arguments import validate_args

assert package.__file__.startswith(TREE), package.__file__
scheduler = scheduler_map["lpt_dynamic_cp"](1024, 2, 4, None)
pairs = [(index, 64 + 97 * index % 2500) for index in range(60)]
groups = scheduler.get_groups_and_subsamples(pairs)
assert all(len(ranks) == 8 and all(ranks) for ranks in groups)
assert sorted({s for ranks in groups for ids in ranks for s in ids}) == list(range(60))
config = SimpleNamespace(sequence_packing_scheduler="lpt_dynamic_cp", max_seqlen_per_dp_cp_rank=512,
                         min_dynamic_context_parallel_size=2, hidden_size=256,
                         num_attention_heads=4, num_query_groups=None)
built = wrap_data_iterator(config, 4, 2)
assert type(built) is LptDynamicCPScheduler and built.min_cp_size == 2
ModelParallelConfig(dynamic_context_parallel=True, sequence_packing_scheduler="lpt_dynamic_cp")
validate_args(SimpleNamespace(dynamic_context_parallel=True,
                              sequence_packing_scheduler="lpt_dynamic_cp"))
assert supported("lpt_dynamic_cp")
print("patched tree ok")
'''


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=120).stdout


@pytest.fixture(scope="module")
def fake_tree(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("fake-megatron")
    for relative, text in FAKE_FILES.items():
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_text(textwrap.dedent(text))
    _git(tree, "init", "--quiet")
    _git(tree, "add", "--all")
    _git(tree, "commit", "--quiet", "-m", "fake Megatron-LM")
    return tree


@pytest.fixture(scope="module")
def series(fake_tree, tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("series")
    assert main(["--megatron", str(fake_tree), "--out", str(out), "--no-test"]) == 0
    return sorted(out.glob("*.patch"))


def test_series_is_regenerated_byte_for_byte(fake_tree, series, tmp_path):
    assert main(["--megatron", str(fake_tree), "--out", str(tmp_path), "--no-test"]) == 0
    again = sorted(tmp_path.glob("*.patch"))
    assert [path.name for path in again] == [path.name for path in series]
    assert [path.read_bytes() for path in again] == [path.read_bytes() for path in series]
    assert len(series) == 4 and series[0].name == "0000-cover-letter.patch"


def test_patches_take_context_from_the_tree_and_fit_upstreams_lines(series):
    scheduler_patch = series[2].read_text()
    assert f" {MARKER}" in scheduler_patch  # a context line only the fake tree has
    added = [line[1:] for path in series[1:] for line in path.read_text().splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    assert max(map(len, added)) <= 100
    assert not [line for line in added if "megatron.varlen" in line or "from tools." in line]
    letter = series[0].read_text()
    assert "*** SUBJECT HERE ***" not in letter and "Known differences" in letter


def test_series_applies_imports_schedules_and_passes_its_core_tests(fake_tree, series,
                                                                     tmp_path):
    tree = tmp_path / "patched"
    _git(tmp_path, "clone", "--quiet", str(fake_tree), str(tree))
    _git(tree, "am", "--quiet", *map(str, series[1:]))
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    check = subprocess.run([sys.executable, "-c", f"TREE = {str(tree)!r}\n" + PATCHED_CHECK],
                           cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "patched tree ok", check.stderr[-2000:]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "--rootdir", str(tree), "tests/unit_tests/data/test_lpt_dynamic_cp.py"],
                           cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0, tests.stdout[-2000:]
    for test in ("tests/unit_tests/data/test_lpt_dynamic_cp_scheduler.py",
                 "tests/unit_tests/test_lpt_dynamic_cp_config.py"):
        compile((tree / test).read_text(), test, "exec")  # they need torch and upstream's code


def test_not_a_megatron_checkout_is_one_line_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "tools/upstream_patch.py", "--megatron",
                             str(tmp_path), "--no-test", "--out", str(tmp_path / "out")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("upstream_patch.py: error: --megatron")
    assert not (tmp_path / "out").exists()


def test_a_checkout_without_the_scheduler_map_is_one_line_exit_2(fake_tree, tmp_path, capsys):
    tree = tmp_path / "other"
    _git(tmp_path, "clone", "--quiet", str(fake_tree), str(tree))
    schedule = tree / "megatron/core/datasets/data_schedule.py"
    schedule.write_text(schedule.read_text().replace("scheduler_map", "schedulers"))
    _git(tree, "commit", "--quiet", "-am", "renamed")
    assert main(["--megatron", str(tree), "--out", str(tmp_path / "out"), "--no-test"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert error.startswith("upstream_patch.py: error: megatron/core/datasets/data_schedule.py: "
                            "expected one 'scheduler_map = {...}' dict, found 0 (--megatron "
                            "needs a Megatron-LM dev checkout")
