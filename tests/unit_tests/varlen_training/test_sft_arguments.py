"""``--sft --data-path``'s flag checks (megatron/varlen_training/sft_arguments.py): one entry,
a ``--split`` that parses; each a one-line ArgumentValidationError (exit code 2 at the entry
point) instead of data read silently otherwise."""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.training_runs import TINY_GPT_ARGS

SFT_ARGS = [arg for arg in TINY_GPT_ARGS if arg != "--mock-data"] + [
    "--train-iters", "3", "--sft"]


@pytest.mark.parametrize("extra, needle", [
    (["--data-path", "a.jsonl", "b.jsonl"],
     "--sft reads one --data-path entry, got 2 (a.jsonl b.jsonl): SFT data is not blended"),
    (["--data-path", "0.3", "a.jsonl", "0.7", "b.jsonl"], "got 4 (0.3 a.jsonl 0.7 b.jsonl)"),
    (["--data-path", "a.jsonl", "--split", "98,x"], "--split '98,x' is not a split"),
])
def test_sft_data_path_flags_that_would_be_read_otherwise_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(SFT_ARGS + extra, world_size=1)
    message = str(err.value)
    assert needle in message and "\n" not in message, message


def test_one_entry_and_a_split_pass():
    args = parse_args(SFT_ARGS + ["--data-path", "a.jsonl", "--split", "90,10,0"], world_size=1)
    assert args.data_path == ["a.jsonl"] and args.split == "90,10,0"


LENGTHS = '{"mode": "distribution", "type": "uniform", "min_seq_len": 4, "max_seq_len": 32}'


@pytest.mark.parametrize("argv, needle", [
    (TINY_GPT_ARGS + ["--train-iters", "3", "--sft", "--data-path", "chats.jsonl"],
     "--mock-data makes its samples up, so --data-path chats.jsonl would not be read: drop "
     "--mock-data to train on the data, or drop --data-path"),
    (TINY_GPT_ARGS + ["--train-iters", "3", "--data-path", "0.5", "a", "0.5", "b"],
     "so --data-path 0.5 a 0.5 b would not be read"),
    (TINY_GPT_ARGS + ["--train-iters", "3", "--valid-data-path", "v"],
     "so --valid-data-path v would not be read"),
    (SFT_ARGS + ["--data-path", "chats.jsonl", "--sft-mock-dataset-config-json", LENGTHS],
     "--sft-mock-dataset-config-json shapes the lengths of --mock-data --sft samples: it needs "
     "both flags"),
])
def test_data_flags_mock_data_would_not_read_are_one_line(argv, needle):
    """--mock-data beside data paths, or a mock length config beside real SFT data, trained on
    the mock samples without a word (Megatron-LM ignores the paths too)."""
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(argv, world_size=1)
    message = str(err.value)
    assert needle in message and "\n" not in message, message
