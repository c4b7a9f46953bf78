"""tools/upstream_schedulers.py: the worker's import stubs and the independent evaluation.

A fake checkout (written here, no upstream code) imports the same module-level names as
upstream's data_schedule*.py files, so the test proves the stubs let such files load without
Transformer Engine, CUDA or upstream's package __init__ files."""

import subprocess
import sys

import pytest

from megatron.varlen.scheduling import ScheduleProblem, critical_path, get_scheduler
from tools.upstream_schedulers import check_checkout, evaluate_upstream, run_upstream

FAKE_UTILS = '''
import torch
from megatron.core.extensions.transformer_engine import get_thd_partitioned_indices
from megatron.core.rerun_state_machine import RerunDataIterator


def one_per_rank(pairs, num_ranks):
    """Longest first, one sample per rank per micro-batch."""
    ordered = sorted(pairs, key=lambda pair: -pair[1])
    return [[[sample] for sample, _ in ordered[start:start + num_ranks]]
            for start in range(0, len(ordered), num_ranks)]
'''
FAKE_SCHEDULE = '''
import torch
from megatron.core import parallel_state
from megatron.core.datasets.data_schedule_utils import one_per_rank
from megatron.core.packed_seq_params import PackedSeqParams, pad_sequence_for_thd
from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank


class DpBalancedScheduler:
    def __init__(self, budget, cp_size, dp_size, vpp, max_num_seqs=None):
        self.num_ranks = cp_size * dp_size

    def get_groups_and_subsamples(self, pairs):
        return one_per_rank(pairs, self.num_ranks)


class DefaultDynamicCPScheduler(DpBalancedScheduler):
    def __init__(self, *args, min_cp_size=1, **kwargs):
        super().__init__(*args, **kwargs)
        if min_cp_size > 1:
            raise AssertionError("fake scheduler: min_cp_size > 1")
'''


@pytest.fixture
def fake_checkout(tmp_path):
    datasets = tmp_path / "megatron" / "core" / "datasets"
    datasets.mkdir(parents=True)
    (datasets / "data_schedule_utils.py").write_text(FAKE_UTILS)
    (datasets / "data_schedule.py").write_text(FAKE_SCHEDULE)
    return str(tmp_path)


def test_worker_runs_checkout_schedulers_and_reports_their_errors(fake_checkout):
    lengths = [300, 20, 700, 64, 5]
    job = {"lengths": lengths, "dp_size": 2, "cp_size": 1, "budget": 1024, "repeats": 2}
    results = run_upstream(fake_checkout, [{**job, "scheduler": "dynamic"},
                                           {**job, "scheduler": "dp_balanced"},
                                           {**job, "scheduler": "dynamic", "min_cp_size": 2}])
    expected = [[[2], [0]], [[3], [1]], [[4], []]]
    assert results[0]["microbatches"] == expected and results[1]["microbatches"] == expected
    assert results[0]["ms"] >= 0.0
    assert results[2] == {"error": "AssertionError: fake scheduler: min_cp_size > 1"}


def test_missing_checkout_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="--upstream-megatron"):
        check_checkout(str(tmp_path))
    result = subprocess.run([sys.executable, "tools/benchmark_schedulers.py", "--quick",
                             "--out", str(tmp_path / "out"), "--upstream-megatron",
                             str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--upstream-megatron" in result.stderr
    assert "Traceback" not in result.stderr


def test_checkout_without_the_schedulers_is_a_one_line_error(fake_checkout, tmp_path):
    """Newer Megatron-LM dev has data_schedule.py without DefaultDynamicCPScheduler."""
    schedule = tmp_path / "megatron" / "core" / "datasets" / "data_schedule.py"
    schedule.write_text(FAKE_SCHEDULE.split("class DefaultDynamicCPScheduler")[0])
    with pytest.raises(ValueError, match="has no class DefaultDynamicCPScheduler"):
        check_checkout(fake_checkout)
    result = subprocess.run([sys.executable, "tools/benchmark_schedulers.py", "--quick",
                             "--out", str(tmp_path / "out"), "--upstream-megatron",
                             fake_checkout], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "DefaultDynamicCPScheduler" in lines[0] and "--upstream-megatron" in lines[0]


def test_evaluation_matches_our_critical_path():
    """The evaluator recomputes the critical path from ranks' sample lists alone; on our own
    schedules it must agree with metrics.critical_path."""
    problem = ScheduleProblem(lengths=(3000, 300, 1200, 64, 64, 2, 999, 4000), dp_size=2,
                              cp_size=2, max_seqlen_per_rank=1024)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    microbatches = [[list(ids) for ids in ranks] for ranks in schedule.microbatches]
    evaluated = evaluate_upstream(microbatches, list(problem.lengths), problem.cost)
    assert evaluated["critical_path"] == pytest.approx(critical_path(problem, schedule))
    assert evaluated["max_rank_tokens"] <= problem.max_seqlen_per_rank
    with pytest.raises(AssertionError, match=r"holds sample \d+ 2 times"):
        evaluate_upstream(microbatches + microbatches[:1], list(problem.lengths), problem.cost)
