"""Every refused / accepted-without-effect Megatron-LM flag, from the one kind of table
(refused_flags.FlagRow) that every flag group registers them with.

The rows come from the parsers themselves (each registered action carries its row), so a new
table is covered without being listed here. For each refused row, each of its option strings
at a value that asks for something stops the run in one line naming the flag and why (exit
code 2, printed once), and Megatron-LM's default and the row's other neutral values, given on
a command line, are accepted; every accepted row at another value than its default changes
no field of the run's config. Parse and validate only: no process group, no model.
"""

import argparse

import pytest

from megatron.varlen_training.arguments import build_parser, exit_on_flag_errors, validate_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser, parse_hybrid_args
from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, registered_rows
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "3"]
MAMBA_BASE = BASE + ["--num-layers", "3", "--hybrid-layer-pattern", "M*-", "--mamba-head-dim",
                     "8", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]
GPT_PARSER = build_parser()
GPT_ROWS = registered_rows(GPT_PARSER)
HYBRID_ONLY_ROWS = [row for row in registered_rows(build_hybrid_parser())
                    if row.flag not in {gpt_row.flag for gpt_row in GPT_ROWS}]
ASKING_NUMBER = "7"  # no neutral value of any row


def _parse_gpt(argv: list[str]) -> argparse.Namespace:
    args = GPT_PARSER.parse_args(BASE + argv)
    args.world_size = 1
    return validate_args(args)


def _parse_hybrid(argv: list[str]) -> argparse.Namespace:
    return parse_hybrid_args(MAMBA_BASE + argv, world_size=1)


def _command_line(value) -> list[str]:
    """``value`` as a command line gives it (a list: one token each)."""
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]


def _asking_value(row: FlagRow) -> list[str]:
    """A value of the row's flag that asks for something: the switch itself, a choice that is
    not neutral, or a number no neutral value equals."""
    if row.kwargs.get("action"):
        return []
    neutral = {" ".join(_command_line(value)) for value in row.neutral_values()}
    if row.kwargs.get("choices"):
        return [next(str(choice) for choice in row.kwargs["choices"]
                     if str(choice) not in neutral)]
    return [ASKING_NUMBER]


def _other_value(row: FlagRow) -> list[str]:
    """An accepted row's value other than its default, inside any range the flag layer checks
    (Megatron-LM's: decay rates and fractions in [0, 1], step counts >= 1)."""
    default = row.default
    if row.kwargs.get("action") or row.kwargs.get("choices"):
        return _asking_value(row)
    if isinstance(default, float) or (default is None and row.kwargs.get("type") is float):
        return [str((default or 1.0) / 2)]
    if isinstance(default, int):
        return [str(default + 1)]
    return [ASKING_NUMBER]


def test_the_rows_are_every_refused_and_accepted_flag_of_both_parsers():
    """Each row is registered once, under its own dest (no row writes another flag's value),
    and every table of the flag groups is there (a sample of each)."""
    flags = [row.flag for row in GPT_ROWS]
    assert len(flags) == len(set(flags)) > 350
    assert {"--fp8-margin", "--log-straggler", "--muon-momentum", "--use-torch-fsdp2",
            "--fim-rate", "--ckpt-convert-save", "--cache-mla-latents", "--log-energy",
            "--attention-output-gate", "--vocab-extra-ids", "--iterations-to-skip",
            "--decoder-seq-length",
            "--optimizer-cpu-offload", "--moe-enable-deepep", "--async-strategy",
            "--head-lr-mult"} <= set(flags)
    assert [row.flag for row in HYBRID_ONLY_ROWS] == ["--disable-mamba-mem-eff-path",
                                                      "--mamba-training-ssm-states-dtype"]
    owners = {}
    for action in GPT_PARSER.flag_actions:
        owners.setdefault(action.dest, []).append(action.option_strings[0])
    shared = {row.dest: owners[row.dest] for row in GPT_ROWS if len(owners[row.dest]) > 1}
    assert shared == {}, shared


def _refusal(parse, row: FlagRow, option: str, capsys) -> tuple[object, str]:
    """(exit code, printed error) of an entry point given ``option`` at a value asking for
    something; (None, "") where the run would go on."""
    try:
        with exit_on_flag_errors("pretrain_gpt.py"):
            parse([option, *_asking_value(row)])
    except SystemExit as exit_info:
        return exit_info.code, capsys.readouterr().err
    return None, ""


@pytest.mark.parametrize("parse, rows", [(_parse_gpt, GPT_ROWS), (_parse_hybrid, HYBRID_ONLY_ROWS)],
                         ids=["pretrain_gpt", "pretrain_mamba"])
def test_every_refused_row_is_one_line_and_its_neutral_values_pass(parse, rows, capsys):
    wrong = []
    for row in (row for row in rows if row.refused):
        for option in row.names:
            code, printed = _refusal(parse, row, option, capsys)
            line = printed.removeprefix("pretrain_gpt.py: error: ")
            if not (code == 2 and printed.count("\n") == 1 and line.startswith(row.flag)
                    and row.why in line):
                wrong.append((option, code, printed))
        for value in row.neutral_values():
            try:
                parse([row.flag, *_command_line(value)])
            except ArgumentValidationError as err:
                wrong.append((row.flag, value, str(err)))
    assert wrong == [], wrong


def test_every_accepted_row_at_another_value_changes_nothing():
    """The run built with every accepted flag at another value than Megatron-LM's default is
    the run built without them (the typed config compares every field; nothing below the flag
    layer reads the namespace: test_config.py)."""
    argv = []
    for row in (row for row in GPT_ROWS if not row.refused):
        argv += [row.names[-1], *_other_value(row)]
    assert len(argv) > 100
    assert run_config(_parse_gpt(argv)) == run_config(_parse_gpt([]))


# --- the row itself, against hand-written expectations --------------------------------------

SWITCH_ROW = FlagRow(("--turn-on",), SWITCH, False, "why")
OFF_SWITCH_ROW = FlagRow(("--no-thing", "--disable-thing"),
                         {"action": "store_false", "dest": "thing"}, True, "why")
UNTYPED_NUMBER_ROW = FlagRow(("--layers",), {}, 0, "why")  # Megatron-LM's typed default
TYPED_FLOAT_ROW = FlagRow(("--offset",), {"type": float}, 0.0, "why")
TEXT_ROW = FlagRow(("--extra",), {}, None, "why", accepts=("0",))
LIST_ROW = FlagRow(("--groups",), {"nargs": "*"}, None, "why", accepts=("",))
BOOL_VALUE_ROW = FlagRow(("--lazy",), {"type": bool, "nargs": "?", "const": True}, None, "why")


@pytest.mark.parametrize("row, value, neutral", [
    (SWITCH_ROW, False, True), (SWITCH_ROW, True, False),
    (OFF_SWITCH_ROW, True, True), (OFF_SWITCH_ROW, False, False),
    (UNTYPED_NUMBER_ROW, None, True), (UNTYPED_NUMBER_ROW, "0", True),
    (UNTYPED_NUMBER_ROW, "0.0", True), (UNTYPED_NUMBER_ROW, "2", False),
    (UNTYPED_NUMBER_ROW, "zero", False),
    (TYPED_FLOAT_ROW, 0.0, True), (TYPED_FLOAT_ROW, -0.0, False), (TYPED_FLOAT_ROW, 0.5, False),
    (TEXT_ROW, "0", True), (TEXT_ROW, "0.0", False), (TEXT_ROW, "None", False),
    (TEXT_ROW, 0, True),
    (LIST_ROW, [], True), (LIST_ROW, [""], True), (LIST_ROW, ["a"], False),
    (BOOL_VALUE_ROW, False, True), (BOOL_VALUE_ROW, True, False),
])
def test_which_values_ask_for_nothing(row, value, neutral):
    """Not given, the default or an accepted value (printed the same; text equal to a numeric
    default as a number) asks for nothing; any other value, a switch given, asks for
    something. -0.0 prints otherwise than 0.0 and is refused, as before the tables merged."""
    assert row.asks_for_nothing(value) is neutral


def test_the_help_and_the_line_of_a_row():
    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("refused")
    add_flag_rows(group, (FlagRow(("--mode",), {"choices": ("a", "b")}, "a", "only a here",
                                  accepts=("b",)),
                          FlagRow(("--queue",), {}, "", "no queue here"),
                          OFF_SWITCH_ROW), skip=("--queue",))
    helps = {action.option_strings[0]: action.help for action in group._group_actions}
    assert helps == {"--mode": "Refused (but a or b, which changes nothing): only a here.",
                     "--no-thing": "Refused: why."}
    assert FlagRow(("--queue",), {}, "", "q").help() == "Refused (but '', which changes " \
                                                        "nothing): q."
    assert FlagRow(("--x",), {}, 1, "read nowhere", refused=False).help() == \
        "Accepted, no effect: read nowhere."
    assert parser.parse_args(["--disable-thing"]).thing is False
