"""The per-step read agreement (one MIN all-reduce over the world) runs only where a read can
fail: SFT files, and indexed data read without a memory map. Mock data and memory-mapped indexed
data skip it, on every rank alike, decided from the flags (no collective decides it).

Counted on pretrain_gpt.py's own path (2 gloo ranks, a tiny GPT, both providers): the all-reduces
of ``read_agreement.first_failed_read`` per run, against the iterations trained.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron.varlen_training.config.data import DataConfig
from megatron.varlen_training.read_agreement import reads_can_fail

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

WORLD = 2
ITERATIONS = 2
RUN_TIMEOUT_S = 240
_COMMON = dict(data_path=None, sft_mock_dataset_config_json=None, tokenizer_type="NullTokenizer",
               sft_messages_key="messages", sft_prompt_key="prompt",
               sft_response_key="response", tokenizer_model=None, train_samples=8,
               eval_samples=0)


@pytest.mark.parametrize("kind, flags, can_fail", [
    ("mock", dict(mock_data=True, sft=False), False),
    ("mock SFT", dict(mock_data=True, sft=True), False),
    ("SFT file", dict(mock_data=False, sft=True, data_path=("chats.jsonl",)), True),
    ("indexed, memory-mapped", dict(mock_data=False, sft=False, data_path=("corpus",)), False),
    ("indexed, file reads", dict(mock_data=False, sft=False, data_path=("corpus",),
                                 mmap_bin_files=False), True),
])
def test_which_data_can_fail_when_read(kind, flags, can_fail):
    assert reads_can_fail(DataConfig(**{**_COMMON, **flags})) is can_fail, kind


def _count_agreements(argv: list[str]) -> int:
    """Trains ``argv`` on this rank; the read agreements it made."""
    from megatron.varlen_training import read_agreement

    from tests.harness.training_runs import train_on_this_rank

    calls, agree = [0], read_agreement.first_failed_read

    def counting(failure):
        calls[0] += 1
        return agree(failure)

    read_agreement.first_failed_read = counting
    try:
        train_on_this_rank(argv)
    finally:
        read_agreement.first_failed_read = agree
    return calls[0]


def _on_each_rank(runs: dict) -> dict:
    return {name: _count_agreements(argv) for name, argv in runs.items()}


def _without(args: list[str], *flags: str) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = arg != "--mock-data"  # the others take a value
            continue
        kept.append(arg)
    return kept


def test_agreements_counted_on_the_training_path(tmp_path: Path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"prompt": f"say {i}", "response": "ok " * (i % 5)}) +
                             "\n" for i in range(40)))
    base = TINY_GPT_ARGS + ["--train-iters", str(ITERATIONS)]
    sft = _without(base, "--mock-data", "--tokenizer-type", "--vocab-size") + [
        "--sft", "--data-path", str(chats), "--tokenizer-type", "ByteLevelTokenizer",
        "--vocab-size", "320"]
    packed = ["--sequence-packing", "--max-seqlen-per-dp-cp-rank", "64",
              "--micro-batch-size", "1"]
    runs = {"mock": base, "mock_packed": base + packed, "sft": sft, "sft_packed": sft + packed}
    counts = run_distributed(_on_each_rank, WORLD, args=(runs,), timeout_s=RUN_TIMEOUT_S)
    for rank_counts in counts:  # the same on every rank: they agree without a collective
        assert rank_counts == {"mock": 0, "mock_packed": 0, "sft": ITERATIONS,
                               "sft_packed": ITERATIONS}, counts
