"""Megatron-LM's checkpoint-content and strategy flags (checkpoint_save_arguments.py,
checkpoint/parts.py, checkpoint/strategies.py), on 2 data-parallel gloo ranks.

- ``--no-save-optim``: the checkpoint's metadata holds no optimizer or schedule key; resuming
  from it without ``--no-load-optim`` stops in one line naming ``--no-load-optim`` (Megatron-LM's
  "Unable to load optimizer ... Specify --no-load-optim or --finetune"); with it, the resume
  trains exactly as a ``--no-load-optim`` resume from a full checkpoint (the same weights, a
  fresh optimizer): the reference.
- ``--no-save-rng``: no RNG files; a resume (no flag needed, as Megatron-LM) continues as the
  straight run (dropout 0: the random states change nothing else).
- fully parallel save (the default), ``--no-ckpt-fully-parallel-save`` and
  ``--ckpt-fully-parallel-load``: every combination resumes as the straight run continues.
- ``--dist-ckpt-strictness raise_all`` reaches megatron-core's load: a ``--no-load-optim`` load of
  a full checkpoint (optimizer keys not loaded) stops in one line; the default accepts it.
- Deprecated ``--use-dist-ckpt`` / ``--dist-ckpt-format`` are accepted with Megatron-LM's line;
  the ``return_*`` strictness modes and the refused flags are one line.
"""

import json
import logging
import os
import re

import pytest
from torch.distributed.checkpoint import FileSystemReader

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.checkpoint import checkpoint_dir
from megatron.varlen_training.checkpoint.parts import SAVED_PARTS_KEY
from megatron.varlen_training.checkpoint.rng_state import RNG_SUBDIR
from megatron.varlen_training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

WORLD = 2  # two data-parallel replicas: the fully parallel strategies split work between them
LAUNCH_TIMEOUT_S = 300
BASE = TINY_GPT_ARGS + ["--train-iters", "4", "--lr-decay-iters", "4"]


def _losses_or_refusal(argv: list[str]) -> dict:
    try:
        return {"losses": [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]}
    except CheckpointError as err:
        return {"refusal": str(err)}


def _saved(folder: str, name: str, extra: list[str]) -> str:
    root = os.path.join(folder, name)
    _losses_or_refusal(BASE + ["--train-iters", "2", "--save", root] + extra)
    return root


def _cases(folder: str) -> dict:
    out = {"straight": _losses_or_refusal(BASE)}
    full = _saved(folder, "full", [])
    no_optim = _saved(folder, "no_optim", ["--no-save-optim"])
    no_rng = _saved(folder, "no_rng", ["--no-save-rng"])
    serial = _saved(folder, "serial", ["--no-ckpt-fully-parallel-save"])
    loads = {
        "full": ["--load", full],
        "full_parallel_load": ["--load", full, "--ckpt-fully-parallel-load"],
        "serial": ["--load", serial],
        "serial_parallel_load": ["--load", serial, "--ckpt-fully-parallel-load"],
        "no_optim": ["--load", no_optim],
        "no_optim_no_load": ["--load", no_optim, "--no-load-optim"],
        "full_no_load": ["--load", full, "--no-load-optim"],
        "no_rng": ["--load", no_rng],
        "strict_no_load": ["--load", full, "--no-load-optim", "--dist-ckpt-strictness",
                           "raise_all"],
        "strict_full": ["--load", full, "--dist-ckpt-strictness", "raise_all"],
    }
    out.update({name: _losses_or_refusal(BASE + argv) for name, argv in loads.items()})
    out["folders"] = {"full": checkpoint_dir(full, 2), "no_optim": checkpoint_dir(no_optim, 2),
                      "no_rng": checkpoint_dir(no_rng, 2), "serial": checkpoint_dir(serial, 2)}
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    folder = str(tmp_path_factory.mktemp("ckpt_save_flags"))
    results = run_distributed(_cases, WORLD, args=(folder,), timeout_s=LAUNCH_TIMEOUT_S)
    assert results[0] == results[1] or results[0].keys() == results[1].keys()
    return results[0]


def _metadata_keys(folder: str) -> set[str]:
    return set(FileSystemReader(folder).read_metadata().state_dict_metadata)


def _run_args(folder: str) -> dict:
    with open(os.path.join(folder, "run_args.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_no_save_optim_checkpoint_has_no_optimizer_state(cases):
    full, bare = (_metadata_keys(cases["folders"][name]) for name in ("full", "no_optim"))
    assert any(key.startswith("optimizer.") for key in full)
    assert not any(key.startswith("optimizer.") for key in bare), sorted(bare)
    assert {key for key in full if not key.startswith("optimizer.")} == bare
    assert _run_args(cases["folders"]["no_optim"])[SAVED_PARTS_KEY] == {"optimizer": False,
                                                                      "rng": True}
    assert _run_args(cases["folders"]["full"])[SAVED_PARTS_KEY] == {"optimizer": True,
                                                                  "rng": True}


def test_resume_without_optimizer_state_needs_no_load_optim(cases):
    refusal = cases["no_optim"]["refusal"]
    assert "holds no optimizer state (saved with --no-save-optim): add --no-load-optim" in \
        refusal and "\n" not in refusal


def test_no_load_optim_resume_is_a_fresh_optimizer_on_the_saved_weights(cases):
    reference = cases["full_no_load"]["losses"]
    assert len(reference) == 2
    assert cases["no_optim_no_load"]["losses"] == reference
    assert reference != cases["straight"]["losses"][2:], "a fresh optimizer trains otherwise"


def test_no_save_rng_checkpoint_resumes_without_random_states(cases):
    folder = cases["folders"]["no_rng"]
    assert not os.path.exists(os.path.join(folder, RNG_SUBDIR))
    assert _run_args(folder)[SAVED_PARTS_KEY]["rng"] is False
    assert cases["no_rng"]["losses"] == cases["straight"]["losses"][2:]


@pytest.mark.parametrize("case", ["full", "full_parallel_load", "serial",
                                  "serial_parallel_load", "strict_full"])
def test_save_and_load_strategies_resume_the_straight_run(cases, case):
    assert cases[case]["losses"] == cases["straight"]["losses"][2:], cases[case]


def _bytes_by_writer(folder: str) -> dict[int, int]:
    """Bytes of torch_dist data files per writing rank (``__<rank>_<n>.distcp``)."""
    written = {}
    for name in os.listdir(folder):
        match = re.fullmatch(r"__(\d+)_\d+\.distcp", name)
        if match:
            rank = int(match.group(1))
            written[rank] = written.get(rank, 0) + os.path.getsize(os.path.join(folder, name))
    return written


def test_fully_parallel_save_spreads_the_writes(cases):
    """Pure data parallelism replicates every tensor: megatron-core's default strategy has the
    first replica (rank 0) write them all; the fully parallel one shares them out."""
    spread, serial = (_bytes_by_writer(cases["folders"][name]) for name in ("full", "serial"))
    assert sum(spread.values()) == pytest.approx(sum(serial.values()), rel=0.05)
    assert serial.get(1, 0) < 0.05 * serial[0], serial
    assert min(spread.get(0, 0), spread.get(1, 0)) > 0.2 * sum(spread.values()), spread


def test_strictness_reaches_the_load(cases):
    refusal = cases["strict_no_load"]["refusal"]
    assert refusal.startswith("--load: --dist-ckpt-strictness raise_all stops on keys") and \
        "\n" not in refusal, refusal


def test_deprecated_flags_are_accepted_with_megatron_lms_line(caplog):
    with caplog.at_level(logging.WARNING):
        args = parse_args(BASE + ["--use-dist-ckpt", "--dist-ckpt-format", "zarr",
                                  "--ckpt-fully-parallel-save"], world_size=1)
    assert args.ckpt_format == "torch_dist"
    text = caplog.text
    for flag in ("--use-dist-ckpt", "--dist-ckpt-format"):
        assert (f"{flag} is deprecated and has no effect. Use --ckpt-format to select the "
                f"checkpoint format.") in text
    assert "--ckpt-fully-parallel-save flag is deprecated and has no effect." in text


def test_persistent_save_interval_is_save_interval():
    args = parse_args(BASE + ["--persistent-save-interval", "3"], world_size=1)
    assert args.save_interval == 3


@pytest.mark.parametrize("extra, needle", [
    (["--dist-ckpt-strictness", "return_all"], "--dist-ckpt-strictness return_all is not "
                                               "supported"),
    (["--save-retain-interval", "2"], "--save-retain-interval 2 is not supported"),
    (["--non-persistent-local-ckpt-dir", "/tmp/x"], "--non-persistent-local-ckpt-dir /tmp/x"),
    (["--override-ckpt-iteration", "3"], "--override-ckpt-iteration 3 is not supported"),
    (["--replication-factor", "3"], "--replication-factor 3 is not supported"),
    (["--load-main-params-from-ckpt"], "--load-main-params-from-ckpt is not supported"),
])
def test_refusals_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_neutral_values_are_accepted():
    parse_args(BASE + ["--replication-factor", "2", "--dist-ckpt-workers", "1",
                       "--non-persistent-local-ckpt-algo", "fully_parallel",
                       "--ckpt-assume-constant-structure", "--no-strict-fsdp-dtensor-load"],
               world_size=1)


@pytest.mark.parametrize("extra, save_wrapped, load_wrapped", [
    ([], True, False),
    (["--no-ckpt-fully-parallel-save", "--ckpt-fully-parallel-load"], False, True),
])
def test_strategies_follow_the_flags(monkeypatch, tmp_path, extra, save_wrapped, load_wrapped):
    """Megatron-LM wraps megatron-core's default strategies in its fully parallel ones over the
    data-parallel group (the group itself: the 2-rank runs above)."""
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper, FullyParallelSaveStrategyWrapper,
    )
    from megatron.varlen_training.checkpoint import strategies as checkpoint_strategies
    from megatron.varlen_training.config.from_flags import parse_run_config

    monkeypatch.setattr(checkpoint_strategies, "_data_parallel_group", lambda: None)
    monkeypatch.setattr(checkpoint_strategies, "get_default_load_sharded_strategy",
                        lambda folder: object())
    checkpoint = parse_run_config(BASE + extra, world_size=1).checkpoint
    saving = checkpoint_strategies.save_strategy(checkpoint)
    loading = checkpoint_strategies.load_strategy(checkpoint, str(tmp_path))
    assert isinstance(saving, FullyParallelSaveStrategyWrapper) == save_wrapped
    assert isinstance(loading, FullyParallelLoadStrategyWrapper) == load_wrapped
