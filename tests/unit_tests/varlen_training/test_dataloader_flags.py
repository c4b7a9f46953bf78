"""Megatron-LM's data-loader and dataset-builder flags (dataloader_arguments.py).

- ``--dataloader-type``: unset resolves to ``single`` (Megatron-LM's validate_args), which is
  accepted; ``cyclic`` and ``external`` are one line.
- ``--num-dataset-builder-threads``, ``--mid-level-dataset-surplus``,
  ``--allow-ambiguous-pad-tokens`` reach megatron-core's GPTDatasetConfig under the same names,
  as Megatron-LM's ``core_gpt_dataset_config_from_args`` passes them.
- ``--no-create-attention-mask-in-dataloader`` changes nothing: a packed (THD) SFT run and an
  unpacked pretraining run give bit-identical losses with and without it; beside
  ``--reset-attention-mask`` unpacked (where Megatron-LM would drop the document mask) it is one
  line.
- The refused data sources and FIM are one line; FIM's tuning flags are accepted.
"""

import json
from types import SimpleNamespace

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.indexed import gpt_dataset_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

BASE = TINY_GPT_ARGS + ["--train-iters", "3"]
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 2,
                      "max_seq_len": 32, "mean_seq_len": 12, "lognormal_sigma": 1.0})
PACKED_SFT = TINY_GPT_ARGS + [
    "--train-iters", "3", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--micro-batch-size", "1", "--sequence-packing", "--calculate-per-token-loss",
    "--position-embedding-type", "rope"]
NO_MASK = ["--no-create-attention-mask-in-dataloader"]


def test_dataloader_type_resolves_to_single():
    assert parse_args(BASE, world_size=1).dataloader_type == "single"
    assert parse_args(BASE + ["--dataloader-type", "single"], world_size=1).dataloader_type \
        == "single"


@pytest.mark.parametrize("extra, needle", [
    (["--dataloader-type", "cyclic"], "--dataloader-type cyclic is not supported"),
    (["--dataloader-type", "external"], "--dataloader-type external is not supported"),
    (["--data-args-path", "args.txt"], "--data-args-path args.txt is not supported"),
    (["--per-split-data-args-path", "s.json"], "--per-split-data-args-path s.json"),
    (["--fim-data"], "--fim-data is not supported"),
    (["--dataloader-fast-cache-load"], "--dataloader-fast-cache-load is not supported"),
    (["--object-storage-cache-path", "/c"], "--object-storage-cache-path /c is not supported"),
    (["--num-dataset-builder-threads", "0"], "--num-dataset-builder-threads"),
    (["--mid-level-dataset-surplus", "-0.1"], "--mid-level-dataset-surplus"),
    (["--reset-attention-mask", "--attention-backend", "local", *NO_MASK],
     "--no-create-attention-mask-in-dataloader with --reset-attention-mask and no "
     "--sequence-packing"),
])
def test_refusals_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_fim_tuning_flags_are_accepted():
    args = parse_args(BASE + ["--fim-rate", "0.9", "--fim-prefix-token", "<p>"], world_size=1)
    assert args.fim_rate == 0.9


@pytest.mark.parametrize("extra", [
    [],
    ["--num-dataset-builder-threads", "4", "--mid-level-dataset-surplus", "0.05",
     "--allow-ambiguous-pad-tokens"],
], ids=["defaults", "given"])
def test_builder_fields_reach_megatron_cores_config(extra):
    argv = TINY_GPT_ARGS[:] + ["--train-iters", "3"] + extra
    argv.remove("--mock-data")
    run = parse_run_config(argv + ["--data-path", "/data/corpus_text_document"], world_size=1)
    tokenizer = SimpleNamespace(vocab_size=128, eod=0, pad=0)
    config = gpt_dataset_config(run.data, 32, 7, tokenizer)
    given = parse_args(argv + ["--data-path", "x"], world_size=1)  # Megatron-LM: by name
    for name in ("num_dataset_builder_threads", "mid_level_dataset_surplus",
                 "allow_ambiguous_pad_tokens"):
        assert getattr(config, name) == getattr(given, name), name
    assert config.create_attention_mask is False  # whatever the flag: no dense mask here


def _losses(argv: list[str]) -> list[float]:
    return [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]


def _mask_runs() -> dict:
    return {name: (_losses(argv), _losses(argv + NO_MASK))
            for name, argv in (("packed", PACKED_SFT), ("unpacked", BASE))}


@pytest.fixture(scope="module")
def mask_runs() -> dict:
    return run_distributed(_mask_runs, 1, timeout_s=240)[0]


@pytest.mark.parametrize("layout", ["packed", "unpacked"])
def test_no_attention_mask_flag_changes_nothing(mask_runs, layout):
    with_mask, without = mask_runs[layout]
    assert len(with_mask) == 3 and with_mask == without
