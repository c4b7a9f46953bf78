"""Helpers for tests that run the real training path inside run_distributed ranks."""

from __future__ import annotations

import collections
import contextlib
import json
import pathlib
from collections.abc import Iterator

import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_hybrid_run_config, parse_run_config
from megatron.varlen_training.pretrain import pretrain
from megatron.varlen_training.trainer import Trainer
from megatron.varlen_training.model_family import GPT

TINY_GPT_ARGS = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", "1e-3", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--log-interval", "1", "--eval-iters", "0", "--seed", "7",
]


def tiny_packed_config(global_batch_size: int, train_iters: int) -> dict:
    """A MegatronWrap config tree (``build_config(...).to_argv`` gives pretrain_gpt.py's flags)
    for a one-layer packed SFT run on mock data: both entry points can train it."""
    return {
        "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                  "seq_length": 32, "vocab_size": 64, "make_vocab_size_divisible_by": 32},
        "training": {"micro_batch_size": 1, "global_batch_size": global_batch_size,
                     "train_iters": train_iters, "lr": 1e-3, "seed": 3, "eval_iters": 0,
                     "log_interval": 1},
        "data": {"mock_data": True, "sft": True, "tokenizer_type": "NullTokenizer"},
        "parallel": {"sequence_packing": True},
    }


@contextlib.contextmanager
def stepping_trainer(argv: list[str]) -> Iterator[tuple]:
    """``(trainer, state, provider)`` for pretrain_gpt.py's flags ``argv`` on this rank's process
    group: started, model and optimizer built, the training data provider ready (step ``i`` is
    ``trainer.step(provider.step_batches(i))``); closed on leaving. No console output."""
    from megatron.varlen_training.pretrain import build_data_providers

    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()),
                      console=False)
    try:
        trainer.start()
        provider = build_data_providers(trainer).train
        yield trainer, trainer.setup_model_and_optimizer(), provider
    finally:
        trainer.close()


def train_on_this_rank(argv: list[str]) -> dict:
    """Runs pretrain_gpt's path on an already-initialised process group.

    Returns this rank's history plus where it sits, so tests can pick the loss-owning rank.
    """
    return _train(parse_run_config(argv, world_size=torch.distributed.get_world_size()))


def train_each_on_this_rank(argvs: dict[str, list[str]]) -> dict[str, dict]:
    """:func:`train_on_this_rank` for each named flag list, one after another on the same
    process group: one launch for several runs of one world size (a launch costs more than a
    tiny run). Returns each run's result under its name."""
    return {name: train_on_this_rank(argv) for name, argv in argvs.items()}


def train_hybrid_on_this_rank(argv: list[str]) -> dict:
    """pretrain_mamba.py's path (hybrid flags and model) on an initialised process group."""
    from megatron.varlen_training.hybrid_model import HYBRID

    run = parse_hybrid_run_config(argv, world_size=torch.distributed.get_world_size())
    return _train(run, HYBRID)


def _train(run, family=GPT) -> dict:
    """pretrain() through a Trainer on this rank's process group (which stays)."""
    trainer = Trainer(run, family)
    try:
        history = pretrain(trainer)
        return {
            "history": history,
            "rank": torch.distributed.get_rank(),
            "owns_loss": history[0]["lm_loss"] is not None if history else False,
        }
    finally:
        trainer.close()  # parallel state and dynamic CP groups; not the process group


def train_and_inspect(argv: list[str], hybrid: bool, inspect) -> dict:
    """pretrain_gpt.py's path (pretrain_mamba.py's with ``hybrid``) on this rank's process
    group, quietly, then ``inspect(trainer)`` on the trained model before the trainer closes:
    ``{"history": [{"lm_loss", "grad_norm"} per iteration], "inspected": its value}``."""
    from megatron.varlen_training.hybrid_model import HYBRID

    run = (parse_hybrid_run_config if hybrid else parse_run_config)(
        argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run, HYBRID if hybrid else GPT, console=False)
    try:
        history = pretrain(trainer)
        return {"history": [{k: step[k] for k in ("lm_loss", "grad_norm")} for step in history],
                "inspected": inspect(trainer)}
    finally:
        trainer.close()


def assert_same_history(got: list[dict], want: list[dict], rtol: float, what: str) -> None:
    """Two :func:`train_and_inspect` histories of the same length: every iteration's loss and
    grad norm equal to ``rtol`` (``what`` names the comparison in a failure)."""
    assert len(got) == len(want) > 0, what
    for it, (mine, theirs) in enumerate(zip(got, want), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=rtol), (what, it, key)


# --- step records: each iteration's metrics against a reference stepped by hand ---------------

STEP_KEYS = ("iteration", "global_batch_size", "consumed_samples", "lr", "lm_loss")


def step_records(path) -> list[dict]:
    """The :data:`STEP_KEYS` of every line of a run's ``--log-metrics-jsonl`` file."""
    return [{key: json.loads(line)[key] for key in STEP_KEYS}
            for line in pathlib.Path(path).read_text().splitlines()]


def assert_steps_close(run: list[dict] | str, reference: list[dict], rtol: float) -> None:
    """``run``'s records (or its error text) equal ``reference``'s: iteration, batch size and
    consumed samples exactly, the learning rate to 1e-12, the loss to ``rtol``."""
    assert not isinstance(run, str), run
    exact = [{k: r[k] for k in ("iteration", "global_batch_size", "consumed_samples")}
             for r in run]
    assert exact == [{k: r[k] for k in exact[0]} for r in reference]
    assert [r["lr"] for r in run] == pytest.approx([r["lr"] for r in reference], rel=1e-12)
    assert [r["lm_loss"] for r in run] == pytest.approx([r["lm_loss"] for r in reference],
                                                        rel=rtol)


def one_batch_of(provider, first: int, end: int, seq_length: int):
    """An unpacked provider whose global batch 0 is ``provider``'s samples [first, end) (one
    sample per micro-batch; the provider's transform, FLOP attention lengths and window)."""
    from megatron.varlen_training.data import UnpackedBatchProvider

    samples = torch.utils.data.Subset(provider.dataset, range(first, end))
    return UnpackedBatchProvider(samples, end - first, 1, seq_length,
                                 transform=provider.transform,
                                 attention_lengths=provider.attention_lengths,
                                 attention_window=provider.attention_window)


def loss_owner_history(results: list[dict]) -> list[dict]:
    """The history of the last rank that owns the loss (all loss owners agree)."""
    owners = [r for r in results if r["owns_loss"]]
    assert owners, "no rank reported a loss"
    return owners[-1]["history"]


def _grad_buffers(model) -> list[torch.Tensor]:
    """Every chunk's DDP gradient buffers (the last step's main grads), flattened, copied."""
    return [buffer.grad_data.detach().clone() for chunk in model for buffer in chunk.buffers]


def train_with_grads_on_this_rank(argv: list[str], hybrid: bool = False) -> dict:
    """:func:`train_on_this_rank` (or the hybrid path) that also returns this rank's last-step
    gradient buffers, how many times ``tensor_parallel.checkpoint`` ran (activation
    recomputation actually on, or off), how many times each module's forward ran
    (``forward_calls``, by qualified name ``<chunk>.<name>``: a module recomputed in backward
    runs twice per micro-batch, whichever checkpoint recomputes it) and, per step, the routed
    token counts the expert bias is updated from (``expert_bias_tokens``: this rank's
    ``[MoE layers, experts]`` before megatron-core's all-reduce; empty without
    ``--moe-router-enable-expert-bias``)."""
    import importlib

    from megatron.core import tensor_parallel

    from megatron.varlen_training.hybrid_model import HYBRID

    parse = parse_hybrid_run_config if hybrid else parse_run_config
    run = parse(argv, world_size=torch.distributed.get_world_size())
    calls, forwards = [], collections.Counter()
    original = tensor_parallel.checkpoint

    def counting_checkpoint(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    # megatron.core.distributed.finalize_model_grads is the function of that name: the module
    # (which looks up get_updated_expert_bias when it runs) comes from importlib.
    finalize = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    bias_tokens, original_bias_update = [], finalize.get_updated_expert_bias

    def recording_bias_update(tokens_per_expert, expert_bias, update_rate):
        bias_tokens.append(tokens_per_expert.detach().clone())
        return original_bias_update(tokens_per_expert, expert_bias, update_rate)

    tensor_parallel.checkpoint = counting_checkpoint
    finalize.get_updated_expert_bias = recording_bias_update
    counting = torch.nn.modules.module.register_module_forward_hook(
        lambda module, *_: forwards.update([id(module)]))
    trainer = Trainer(run, HYBRID if hybrid else GPT)
    try:
        history = pretrain(trainer)
        return {"history": history, "rank": torch.distributed.get_rank(),
                "owns_loss": history[0]["lm_loss"] is not None if history else False,
                "grads": _grad_buffers(trainer.state.model), "checkpoint_calls": len(calls),
                "forward_calls": _by_name(forwards, trainer.state.model),
                "expert_bias_tokens": bias_tokens}
    finally:
        counting.remove()
        tensor_parallel.checkpoint = original
        finalize.get_updated_expert_bias = original_bias_update
        trainer.close()


def _by_name(counts: collections.Counter, chunks) -> dict[str, int]:
    """``counts`` keyed by module id -> by ``<chunk index>.<qualified name>`` (every module of
    the chunks, 0 for one never called)."""
    return {f"{index}.{name}": counts[id(module)] for index, chunk in enumerate(chunks)
            for name, module in chunk.named_modules()}


def train_runs_with_grads_on_this_rank(argvs: list[list[str]],
                                       hybrid: bool | list[bool] = False) -> list[dict]:
    """:func:`train_with_grads_on_this_rank` for each of ``argvs`` in turn, on one launch's
    process group (one start-up for several runs); ``hybrid``: for all runs, or one per run."""
    per_run = hybrid if isinstance(hybrid, list) else [hybrid] * len(argvs)
    assert len(per_run) == len(argvs), (len(per_run), len(argvs))
    return [train_with_grads_on_this_rank(argv, is_hybrid)
            for argv, is_hybrid in zip(argvs, per_run)]
