"""Megatron-LM choice values not built here (refused_choices.py), generated from its table:
each refused value is one line naming the flag, the value, why and what to use instead (exit
code 2 from the entry points' parse), and every other value of those flags is still accepted.

Reference: the choice lists of Megatron-LM's own parsers (megatron/training/arguments.py at
core_v0.16.1 and main, read by running each parser's add_argument calls), written down here, so
a value dropped from the table or from a flag's registration fails a test.
"""

from __future__ import annotations

import pytest

from megatron.varlen_training import kernel_arguments
from megatron.varlen_training.arguments import build_parser
from megatron.varlen_training.config.from_flags import parse_run_config, parse_run_config_or_exit
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser
from megatron.varlen_training.refused_choices import REFUSED_CHOICES, refused_values
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "1"]
# Megatron-LM's choices of each flag the table refuses values of: core_v0.16.1's and main's.
MEGATRON_LM_CHOICES = {
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
    "--moe-router-load-balancing-type": {"aux_loss", "seq_aux_loss", "global_aux_loss",
                                         "sinkhorn", "none", "quantile_balancing"},
    "--moe-router-score-function": {"softmax", "sigmoid", "sqrtsoftplus"},
    "--cuda-graph-impl": {"none", "local", "transformer_engine", "full_iteration"},
    "--position-embedding-type": {"learned_absolute", "rope", "mrope", "relative", "none",
                                  "yarn"},
}
# What a value of the flag needs beside it to run (MoE flags mean nothing without experts).
NEEDS = {flag: ["--num-experts", "4", "--disable-bias-linear"]
         for flag in MEGATRON_LM_CHOICES if flag.startswith("--moe-")}
# Values refused by another table for reasons of their own (kernel_arguments: CUDA graphs).
REFUSED_ELSEWHERE = {("--cuda-graph-impl", "local"), ("--cuda-graph-impl", "transformer_engine")}


def _choices(parser, flag: str) -> set[str]:
    return {str(choice) for action in parser.flag_actions if flag in action.option_strings
            for choice in action.choices}


@pytest.mark.parametrize("build", [build_parser, build_hybrid_parser])
def test_flags_accept_megatron_lms_whole_choice_list(build):
    parser = build()
    assert {row.flag for row in REFUSED_CHOICES} == set(MEGATRON_LM_CHOICES)
    for flag, choices in MEGATRON_LM_CHOICES.items():
        assert _choices(parser, flag) == choices, flag


@pytest.mark.parametrize("row", REFUSED_CHOICES, ids=lambda row: f"{row.flag} {row.value}")
def test_each_refused_value_is_one_line_with_exit_code_2(row, capsys):
    assert row.why.strip() and row.instead.strip(), row  # a reason and a way out, both said
    with pytest.raises(SystemExit) as ended:
        parse_run_config_or_exit(BASE + NEEDS.get(row.flag, []) + [row.flag, row.value])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert ended.value.code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"pretrain_gpt.py: error: {row.flag} {row.value} is not supported: "
                        f"{row.why}; use {row.instead}")


def _built(flag: str) -> list[str]:
    return sorted(MEGATRON_LM_CHOICES[flag] - set(refused_values(flag))
                  - {value for name, value in REFUSED_ELSEWHERE if name == flag})


BUILT = [(flag, value) for flag in MEGATRON_LM_CHOICES for value in _built(flag)]


@pytest.mark.parametrize("flag, value", BUILT, ids=[f"{flag} {value}" for flag, value in BUILT])
def test_each_built_value_is_still_accepted(flag, value):
    run = parse_run_config(BASE + NEEDS.get(flag, []) + [flag, value], world_size=1)
    assert run.flag_values[flag[2:].replace("-", "_")] == value


def test_values_refused_elsewhere_keep_their_own_reason():
    for flag, value in REFUSED_ELSEWHERE:
        kernel_refused = {row.flag for row in kernel_arguments.REFUSED_FLAGS}
        assert flag in kernel_refused and value not in refused_values(flag)
