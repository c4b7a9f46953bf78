"""tools/schedule_sim.py: the JSON contract, lengths files, distributions, errors."""

import json
import os
import subprocess
import sys

import pytest

from megatron.varlen.scheduling import Schedule, ScheduleProblem, validate_schedule
from megatron.varlen.scheduling.problem import padded_length

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SIM = os.path.join(REPO_ROOT, "tools", "schedule_sim.py")
LOGNORMAL = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 16,
                        "max_seq_len": 3000, "mean_seq_len": 400, "lognormal_sigma": 1.0})


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SIM, *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)


def _check_document(document: dict, dp: int, cp: int, budget: int) -> None:
    assert {"dp_size", "cp_size", "max_seqlen_per_dp_cp_rank", "scheduler", "cost",
            "global_batches", "summary"} <= set(document)
    assert set(document["cost"]) == {"a", "b", "g", "d"}
    for batch in document["global_batches"]:
        problem = ScheduleProblem(lengths=tuple(batch["lengths"]), dp_size=dp, cp_size=cp,
                                  max_seqlen_per_rank=budget)
        microbatches = tuple(tuple(tuple(ids) for ids in ranks) for ranks in batch["microbatches"])
        cp_sizes = [0] * len(batch["lengths"])  # a sequence's group = the ranks holding it
        for ranks in microbatches:
            for ids in ranks:
                for seq in ids:
                    cp_sizes[seq] += 1
        schedule = Schedule(microbatches=microbatches, cp_sizes=tuple(cp_sizes),
                            padded_lengths=tuple(batch["padded_lengths"]))
        validate_schedule(problem, schedule)
        assert batch["scheduler_ms"] >= 0.0
        if "simple_bound" in batch:
            assert (batch["simple_bound"] <= batch["budget_aware_bound"] * (1 + 1e-9)
                    <= batch["latency_aware_bound"] * (1 + 2e-9)
                    <= batch["critical_path"] * (1 + 3e-9))
        for seq, length in enumerate(batch["lengths"]):
            assert batch["padded_lengths"][seq] == padded_length(length, cp_sizes[seq])


def test_lengths_file_with_header_json(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("length\n" + "\n".join(str(n) for n in [5000, 30, 700, 1200, 64, 64, 2, 999]))
    result = _run("--lengths-file", str(path), "--dp-size", "3", "--cp-size", "2",
                  "--max-seqlen-per-dp-cp-rank", "1024", "--global-batch-size", "4", "--json",
                  "--max-seq-len", "4000")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert len(document["global_batches"]) == 2
    assert document["global_batches"][0]["lengths"] == [4000, 30, 700, 1200]
    _check_document(document, 3, 2, 1024)


@pytest.mark.parametrize("scheduler", ["dp_balanced", "default_dynamic_cp", "empty"])
def test_distribution_json(scheduler):
    result = _run("--distribution", LOGNORMAL, "--dp-size", "2", "--cp-size", "2",
                  "--max-seqlen-per-dp-cp-rank", "2048", "--global-batch-size", "32",
                  "--num-global-batches", "2", "--seed", "3", "--scheduler", scheduler, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["scheduler"] == scheduler and len(document["global_batches"]) == 2
    _check_document(document, 2, 2, 2048)


def test_table_output_and_bad_input():
    table = _run("--distribution", LOGNORMAL, "--dp-size", "4", "--max-seqlen-per-dp-cp-rank",
                 "4096", "--global-batch-size", "16", "--num-global-batches", "1")
    assert table.returncode == 0 and "critical path" in table.stdout and "/latency" in table.stdout
    bad = _run("--distribution", LOGNORMAL, "--dp-size", "4", "--max-seqlen-per-dp-cp-rank",
               "100", "--global-batch-size", "16")
    assert bad.returncode == 2
    assert "--max-seqlen-per-dp-cp-rank" in bad.stderr and bad.stdout == ""
