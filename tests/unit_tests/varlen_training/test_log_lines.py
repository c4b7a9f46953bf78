"""One logging style for both entry points, from a tiny 2-rank (DP=2) run of each.

``pretrain_gpt.py``'s loop and ``MegatronWrap`` train the same packed config; every line either
prints carries the rank prefix and a level, their iteration and validation lines match ONE
pattern (Megatron-LM's line content after the prefix) and carry the loss the run returned, and
only the last rank prints them: with DP=2 rank 0 owns the same loss and must stay quiet.
Rank 0 prints Megatron-LM's arguments dump at start-up, once (both: the Trainer starts them
alike). The same runs also write their
metrics as JSONL (``--log-metrics-jsonl`` and the facade's ``jsonl`` writer): ONE schema, the
same keys in the same order for both entry points.
"""

import contextlib
import io
import json
import re

import pytest
import torch

from megatron.varlen_training.arguments import build_parser
from tests.harness.megatron_lm_line import parse_iteration_line
from tests.harness.training_runs import tiny_packed_config, train_on_this_rank
from tests.harness.multirank import run_distributed
from megatron.wrap import MegatronWrap
from megatron.wrap.config import build_config

WORLD = 2
STEPS = 2
CONFIG = tiny_packed_config(global_batch_size=4, train_iters=STEPS)
# pretrain_gpt.py validates at iteration STEPS (an --eval-interval multiple), then, as the end of
# training, on the validation split again (the next batch) and on the mock data's test split.
EVAL_FLAGS = ["--eval-iters", "1", "--eval-interval", str(STEPS)]
LOG_FLAGS = ["--log-throughput"]  # pretrain_gpt.py's line has Megatron-LM's throughput field
THROUGHPUT = "throughput per GPU (TFLOP/s/GPU)"
FOOTPRINT = "Theoretical memory footprints: weight and optimizer="
BATCH = [{"input_ids": list(range(1, n + 1))} for n in (5, 9, 12, 3)]

# Written from Megatron-LM's line format, not from our formatter.
LINE = re.compile(r"^\[rank (?P<rank>\d+)(?P<coords> \| tp \d+ pp \d+ dp \d+ cp \d+)?\] "
                  r"(?P<level>DEBUG|INFO|WARNING|ERROR) (?P<message>.*)$")
FLOAT = r"\d\.\d{6}E[+-]\d{2}"
# The iteration line: tests/harness/megatron_lm_line.py (Megatron-LM's format strings).
ITERATION = re.compile(r"^ \[[^\]]+\] iteration ")
ARGUMENTS = ["------------------------ arguments ------------------------",
             "-------------------- end of arguments ---------------------"]
# Megatron-LM dests (barrier_with_L1_time); a name of 48 characters or more gets no dots, as in
# Megatron-LM's '.' * (48 - len(name)).
# An empty string value (e.g. --config-logger-dir's default) leaves the line ending in a space,
# as Megatron-LM's dump prints it.
ARGUMENT = re.compile(r"^  [A-Za-z0-9_]+ \.* (\S.*)?$")
VALIDATION = re.compile(
    rf"^ validation loss at iteration (?P<iteration>\d+)(?P<where>( on (validation|test) set)?) "
    rf"\| lm loss value: (?P<loss>{FLOAT}) \| lm loss PPL: {FLOAT} \| $")
RULE = re.compile(r"^-+$")  # Megatron-LM's dashes above and below each validation line


def _captured(run) -> tuple[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run()
    return out.getvalue(), result


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _pretrain(jsonl_path: str) -> dict:
    argv = build_config(CONFIG).to_argv(build_parser()) + EVAL_FLAGS + LOG_FLAGS
    return train_on_this_rank(argv + ["--log-metrics-jsonl", jsonl_path])  # the dump included


def _facade(jsonl_path: str) -> dict:
    logging = {"metric_writers": ["console", "jsonl"], "metrics_jsonl_path": jsonl_path,
               "progress_bar": False}
    with MegatronWrap({**CONFIG, "logging": logging}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        losses = []
        for _ in range(STEPS):
            losses.append(wrap.train(BATCH)["loss"])
            wrap.log_last_metrics()
        return {"losses": losses, "validation": wrap.evaluate(BATCH)["loss"]}


def rank_both_entry_points(tmp: str) -> dict:
    pretrain_jsonl, facade_jsonl = f"{tmp}/pretrain.jsonl", f"{tmp}/facade.jsonl"
    pretrain_out, pretrain = _captured(lambda: _pretrain(pretrain_jsonl))
    facade_out, facade = _captured(lambda: _facade(facade_jsonl))
    history = pretrain["history"]
    last = torch.distributed.get_rank() == WORLD - 1  # the rank that writes the metrics
    return {
        "pretrain": (pretrain_out, [h["lm_loss"] for h in history],
                     [history[-1][key] for key in
                      ("validation_loss", "end_validation_loss", "test_loss")]),
        "facade": (facade_out, facade["losses"], [facade["validation"]]),
        "jsonl": ({"pretrain": _read_jsonl(pretrain_jsonl), "facade": _read_jsonl(facade_jsonl)}
                  if last else None),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Both entry points on WORLD ranks, run once for every test of this module."""
    tmp = str(tmp_path_factory.mktemp("log_lines"))
    return run_distributed(rank_both_entry_points, WORLD, args=(tmp,), timeout_s=240)


def _parse(text: str) -> list[re.Match]:
    lines = [LINE.match(line) for line in text.splitlines()]
    assert all(lines), f"a line without the rank prefix and level:\n{text}"
    return lines


def _loss_lines(lines: list[re.Match]) -> tuple[list, list[re.Match], list[str]]:
    messages = [line["message"] for line in lines]
    return ([parse_iteration_line(m) for m in messages if ITERATION.match(m)],
            [m for m in map(VALIDATION.match, messages) if m],
            [m for m in messages if RULE.match(m)])


def _close(logged: str, value: float) -> bool:
    return abs(float(logged) - value) <= 1e-6 * abs(value)  # the line prints 7 digits


def test_both_entry_points_log_one_style_and_only_the_last_rank_prints_losses(results):
    extras = {}
    for entry in ("pretrain", "facade"):
        first, last = (_parse(r[entry][0]) for r in results)
        said = f"{entry}, rank 0:\n{results[0][entry][0]}\nrank 1:\n{results[-1][entry][0]}"
        assert all(int(line["rank"]) == 0 for line in first)
        assert all(int(line["rank"]) == WORLD - 1 for line in last)
        # Rank 0 owns the same loss (DP=2) but prints only its start-up facts.
        assert _loss_lines(first) == ([], [], []), said
        iterations, validations, rules = _loss_lines(last)
        assert len(iterations) + len(validations) + len(rules) == len(last), said
        assert len(rules) == 2 * len(validations), said
        _, losses, validation_losses = results[-1][entry]
        assert [m.iteration for m in iterations] == list(range(1, STEPS + 1)), said
        assert all(m.train_iters == STEPS and m.number("global batch size") == 4
                   for m in iterations)
        assert all(_close(m.losses["lm loss"], loss) for m, loss in zip(iterations, losses)), \
            (said, losses)
        assert all(m.number("number of skipped iterations") == 0 for m in iterations)
        # Megatron-LM prints the throughput only with --log-throughput (given to pretrain_gpt).
        assert all((THROUGHPUT in m.fields) == (entry == "pretrain") for m in iterations)
        wheres = {"pretrain": ["", " on validation set", " on test set"], "facade": [""]}
        assert [m["where"] for m in validations] == wheres[entry], said
        for validation, loss in zip(validations, validation_losses, strict=True):
            assert int(validation["iteration"]) == STEPS
            assert _close(validation["loss"], loss), (said, validation_losses)
        assert all(line["coords"] and line["level"] == "INFO" for line in last)
        extras[entry] = [list(m.extras) for m in iterations]
    assert extras["pretrain"] == extras["facade"], "the schedule's stats differ between entries"
    assert extras["pretrain"][0], "the packed run's stats (padding ratio, ...) are in the line"
    for entry in ("pretrain", "facade"):
        _check_arguments_dump([line["message"] for line in _parse(results[0][entry][0])])


def test_rank_0_prints_the_theoretical_footprint_with_the_first_two_lines(results):
    """Megatron-LM's report_memory_flag: the footprint follows the iteration lines until one
    after the run's second iteration (--log-interval 1: iterations 1 and 2), on rank 0 only."""
    for entry in ("pretrain", "facade"):
        first, last = (results[rank][entry][0] for rank in (0, -1))
        assert first.count(FOOTPRINT) == STEPS and FOOTPRINT not in last, entry


def test_rank_0_names_the_virtual_pipeline_size_once(results):
    """Megatron-LM's start-up line (its validate_args prints it on every run), on rank 0."""
    line = "Number of virtual stages per pipeline stage: None"
    for entry in ("pretrain", "facade"):
        first, last = ([m["message"] for m in _parse(r[entry][0])] for r in (results[0],
                                                                              results[-1]))
        assert first.count(line) == 1 and line not in last, entry


def _check_arguments_dump(messages: list[str]) -> None:
    """Megatron-LM's dump, once, on rank 0: header, one ``  name ..... value`` line per flag."""
    start, end = (messages.index(marker) for marker in ARGUMENTS)
    assert messages.count(ARGUMENTS[0]) == 1
    dumped = messages[start + 1: end]
    assert all(ARGUMENT.match(line) for line in dumped), dumped
    names = [line.split()[0] for line in dumped]
    assert names == sorted(names) and {"seq_length", "global_batch_size"} <= set(names)
    assert "  seq_length ...................................... 32" in dumped


def test_both_entry_points_write_one_jsonl_schema(results):
    assert results[0]["jsonl"] is None  # only the last rank writes metrics
    pretrain, facade = results[-1]["jsonl"]["pretrain"], results[-1]["jsonl"]["facade"]
    assert [r["iteration"] for r in pretrain] == [r["iteration"] for r in facade] == [1, 2]
    for ours, theirs in zip(pretrain, facade):
        assert list(ours) == list(theirs), sorted(set(ours) ^ set(theirs))
    assert {"lm_loss", "grad_norm", "lr", "consumed_samples", "tokens_per_s"} <= set(pretrain[0])
