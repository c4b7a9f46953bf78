"""The metrics ``train()`` and ``evaluate()`` return, identical on every rank.

Only the last pipeline stage computes losses. Its flow metrics (``[sum, count]`` pairs per
micro-batch) are summed and all-reduced over DP x CP, exactly like the reported loss, and one
broadcast over the pipeline group then gives every stage the loss and the metrics (with
PP > 1 the loss is no longer lost on the first stages). Throughput comes from the REAL lengths
of the global batch (the Trainer's step report), as in ``pretrain_gpt.py``'s log line.
"""

from __future__ import annotations

import math
import resource

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.varlen_training.iteration_metrics import TERA
from megatron.varlen_training.trainer import StepReport
from megatron.varlen_training.training import LOSS_KEY
from megatron.varlen.platform import get_device

LOSS = "loss"
KIB = 1024
GIB = 1024 ** 3


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


def train_metrics(report: StepReport, reduced: dict, num_samples: int) -> dict:
    """The dict ``train()`` returns (see docs/WRAP.md for each key), from the Trainer's step
    report and the loss and flow metrics reduced over every rank."""
    measured = report.metrics
    padding = measured.extra.get("padding_ratio", 0.0)
    return {
        "iteration": measured.iteration,
        **reduced,
        **measured.losses,  # MoE balancing losses, as pretrain_gpt.py's line and JSONL name them
        "grad_norm": None if report.grad_norm is None else float(report.grad_norm),
        "lr": measured.learning_rate,
        "samples": num_samples,
        "tokens": measured.tokens,
        "num_microbatches": measured.num_microbatches,
        "step_time_s": measured.step_time_s,
        "tokens_per_s": measured.tokens_per_s,
        "tflops_per_device": measured.tflops_per_device,
        "padding_ratio": padding,
        "packing_efficiency": 1.0 - padding,
        "schedule_imbalance": measured.extra.get("schedule_imbalance", 1.0),
        # megatron-wrap's names (docs/WRAP.md section 4): the same numbers
        "learning_rate": measured.learning_rate,
        "consumed_samples": measured.consumed_samples,
        "elapsed_time": measured.step_time_s,
        "tflops": measured.flops / TERA,
        "throughput": measured.tflops_per_device,
    }


def memory_metrics() -> dict:
    """Memory use in GiB: megatron-wrap's four CUDA allocator numbers on a GPU; on CPU, where
    torch keeps no allocator statistics, the process's peak resident set size."""
    if torch.cuda.is_available():
        return {"memory_allocated": torch.cuda.memory_allocated() / GIB,
                "memory_reserved": torch.cuda.memory_reserved() / GIB,
                "max_memory_allocated": torch.cuda.max_memory_allocated() / GIB,
                "max_memory_reserved": torch.cuda.max_memory_reserved() / GIB}
    # ru_maxrss is in KiB on Linux
    return {"max_memory_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB / GIB}


def flow_metrics(reduced: dict) -> dict:
    """The flow's own metrics (all but the loss): what the metric writers' record adds to the
    shared JSONL schema."""
    return {name: value for name, value in reduced.items() if name != LOSS}
