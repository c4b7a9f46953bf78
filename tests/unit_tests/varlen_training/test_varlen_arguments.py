"""Packing and dynamic-CP flags: defaults, the resolved config, and one-line errors."""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "1", "--micro-batch-size", "1", "--sft"]


def _parse(extra, world=4):
    return parse_args(BASE + extra, world_size=world)


def test_packing_defaults_and_per_token_loss():
    args = _parse(["--sequence-packing", "--context-parallel-size", "2"])
    assert args.sequence_packing_scheduler == "dp_balanced"
    assert args.max_seqlen_per_dp_cp_rank == 16  # seq 32 / cp 2, a multiple of 2*cp
    assert args.calculate_per_token_loss  # only the global per-token mean is packing-invariant
    assert args.variable_seq_lengths


def test_default_scheduler_alias():
    assert _parse(["--sequence-packing", "--sequence-packing-scheduler", "default"]) \
        .sequence_packing_scheduler == "dp_balanced"


def test_dynamic_cp_resolves_one_config():
    args = _parse(["--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", "16"])
    assert args.dynamic_context_parallel and args.sequence_packing
    assert args.sequence_packing_scheduler == "default_dynamic_cp"
    assert not hasattr(args, "hybrid_context_parallel"), "the alias must not survive parsing"


@pytest.mark.parametrize("extra, needle", [
    (["--dynamic-context-parallel"], "requires --max-seqlen-per-dp-cp-rank"),
    (["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "16",
      "--min-dynamic-context-parallel-size", "8"],
     "--min-dynamic-context-parallel-size 8 must be between 1 and DP x CP = 4"),
    (["--min-dynamic-context-parallel-size", "2"], "needs --dynamic-context-parallel"),
    (["--sequence-packing", "--micro-batch-size", "2", "--global-batch-size", "8"],
     "--micro-batch-size must be 1 (got 2)"),
    (["--sequence-packing", "--spec", "megatron.core.models.gpt.gpt_layer_specs",
      "get_gpt_layer_local_spec"], "needs a core attention that takes packed THD input"),
    (["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "16", "--spec",
      "megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"],
     "DotProductAttention"),
    (["--sequence-packing", "--sequence-packing-scheduler", "default_dynamic_cp"],
     "needs --dynamic-context-parallel"),
    (["--max-seqlen-per-dp-cp-rank", "16"], "needs --sequence-packing"),
    (["--sequence-packing", "--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "8"],
     "--seq-length 32 (padded for CP = 2 ranks: 16 tokens per rank) exceeds "
     "--max-seqlen-per-dp-cp-rank 8"),
    (["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "4"],
     "(padded for DP x CP = 4 ranks: 8 tokens per rank) exceeds --max-seqlen-per-dp-cp-rank 4"),

    (["--sft-mock-dataset-config-json", "{not json"], "--sft-mock-dataset-config-json"),
    (["--sft-mock-dataset-config-json", '{"mode": "file", "path": "/nonexistent/l.csv"}'],
     "/nonexistent/l.csv"),
    (["--sft-mock-dataset-config-json", '{"mode": "histogram"}'], "histogram"),
    (["--sft-mock-dataset-config-json", '{"mode": "distribution", "type": "zipf"}'], "zipf"),
])
def test_bad_flags_are_one_line_errors(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        _parse(extra)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_non_positive_lengths_in_file_are_rejected(tmp_path):
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("length\n12\n0\n7\n")
    config = f'{{"mode": "file", "path": "{lengths}"}}'
    with pytest.raises(ArgumentValidationError) as err:
        _parse(["--sft-mock-dataset-config-json", config])
    assert "0" in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_capacity_check_counts_cp_padding():
    # On 2 DP x CP ranks a 34-token sample pads to 36 (2 x 2 chunks): 18 tokens per rank > 17.
    # (36 learned positions: the padded sample needs them, see reliability/test_position_table.py.)
    extra = ["--seq-length", "34", "--max-position-embeddings", "36",
             "--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "17"]
    with pytest.raises(ArgumentValidationError, match="18 tokens per rank"):
        _parse(extra, world=2)
    _parse(extra[:-1] + ["18"], world=2)  # exactly enough


def test_scheduler_flag_values_come_from_the_registry_and_say_what_they_mean():
    from megatron.varlen_training.arguments import build_parser
    from megatron.varlen.scheduling import get_scheduler
    from megatron.varlen.scheduling.dp_balanced import dp_balanced
    from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
    from megatron.varlen.scheduling.empty import empty

    action = next(a for a in build_parser()._actions
                  if a.dest == "sequence_packing_scheduler")
    # Megatron-LM's names, the fork's `empty`, and the early alias `default`: all still accepted.
    expected = {"dp_balanced": dp_balanced, "default_dynamic_cp": default_dynamic_cp,
                "empty": empty, "default": dp_balanced}
    assert sorted(action.choices) == sorted(expected)
    assert {name: get_scheduler(name) for name in action.choices} == expected
    assert "default: alias of dp_balanced" in action.help
    assert "not related to default_dynamic_cp" in action.help
