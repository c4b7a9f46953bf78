"""The metrics ``train()`` and ``evaluate()`` return, identical on every rank.

Only the last pipeline stage computes losses. Its flow metrics (``[sum, count]`` pairs per
micro-batch) are summed and all-reduced over DP x CP, exactly like the reported loss, and one
broadcast over the pipeline group then gives every stage the loss and the metrics (with
PP > 1 the loss is no longer lost on the first stages). Throughput comes from the REAL lengths
of the global batch (``megatron.varlen_training.flops``), as in ``pretrain_gpt.py``'s log line.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.varlen_training.flops import num_floating_point_operations
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.training import LOSS_KEY
from megatron.varlen.platform import get_device

LOSS = "loss"


def reduce_across_stages(loss: float | None, records: list[dict],
                         names: tuple[str, ...]) -> dict[str, float]:
    """``{"loss": global per-token mean, name: sum / count, ...}`` on every rank.

    Args:
        loss: ``train_step``'s reported loss (None off the last pipeline stage).
        records: The ``{name: tensor([sum, count])}`` of each micro-batch this rank scored.
        names: The flow's metric names; ``"lm loss"`` is reported as ``"loss"``.
    """
    extra = [name for name in names if name != LOSS_KEY]
    values = torch.zeros(1 + 2 * len(extra), dtype=torch.float64, device=get_device())
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        values[0] = math.nan if loss is None else loss
        if extra:
            values[1:] = _sum_over_dp_cp(records, extra, values)
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(values, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                       group=parallel_state.get_pipeline_model_parallel_group())
    reduced = {LOSS: values[0].item()}
    for i, name in enumerate(extra):
        reduced[name] = (values[1 + 2 * i] / values[2 + 2 * i].clamp(min=1)).item()
    return reduced


def _sum_over_dp_cp(records: list[dict], names: list[str], like: torch.Tensor) -> torch.Tensor:
    """``[sum_0, count_0, sum_1, ...]`` of ``names`` over micro-batches and DP x CP ranks."""
    pairs = torch.zeros(2 * len(names), dtype=like.dtype, device=like.device)
    for record in records:
        for i, name in enumerate(names):
            pairs[2 * i: 2 * i + 2] += record[name].detach().reshape(2).to(pairs)
    dist.all_reduce(pairs, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return pairs


def train_metrics(args, state, step, reduced: dict, grad_norm, num_samples: int,
                  step_time_s: float) -> tuple[dict, dict]:
    """(the dict ``train()`` returns (see docs/WRAP.md for each key), the metric writers'
    record: ``pretrain_gpt.py``'s JSONL schema plus the flow's own metrics)."""
    lr = state.optimizer.param_groups[0]["lr"]
    measured = IterationMetrics(
        iteration=state.iteration, train_iters=args.train_iters,
        consumed_samples=state.iteration * args.global_batch_size, step_time_s=step_time_s,
        learning_rate=lr, global_batch_size=args.global_batch_size, lm_loss=reduced[LOSS],
        grad_norm=grad_norm, num_microbatches=step.num_microbatches, tokens=step.seqlen_sum,
        seqlen_sum=step.seqlen_sum, seqlen_squared_sum=step.seqlen_squared_sum,
        flops=num_floating_point_operations(args, step.seqlen_sum, step.seqlen_squared_sum),
        world_size=dist.get_world_size(), extra=dict(step.stats),
    )
    padding = step.stats.get("padding_ratio", 0.0)
    returned = {
        "iteration": state.iteration,
        **reduced,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "lr": lr,
        "samples": num_samples,
        "tokens": step.seqlen_sum,
        "num_microbatches": step.num_microbatches,
        "step_time_s": step_time_s,
        "tokens_per_s": measured.tokens_per_s,
        "tflops_per_device": measured.tflops_per_device,
        "padding_ratio": padding,
        "packing_efficiency": 1.0 - padding,
        "schedule_imbalance": step.stats.get("schedule_imbalance", 1.0),
    }
    return returned, writer_record(measured, reduced)


def writer_record(measured: IterationMetrics, reduced: dict) -> dict:
    """The shared JSONL schema (``to_json_record``) plus the flow's metrics other than loss."""
    return to_json_record(measured, {k: v for k, v in reduced.items() if k != LOSS})
