"""Megatron-LM's packing-scheduler interface over our ``default_dynamic_cp``.

Upstream's data path (megatron/core/datasets/data_schedule.py) hands a scheduler the global
batch as ``(sample id, padded length)`` pairs and takes back ``sample_id_groups``: per
micro-batch, per DPxCP rank, the ids that rank packs; the ranks that hold a sample form its CP
group. Three facts of that data path shape this module:

* it packs at least one sample on every rank of every micro-batch (it has no dummy for an idle
  rank), so idle ranks are filled (fill_idle.py);
* its dynamic CP groups are what parallel_state creates: the aligned blocks of every power of
  two below DPxCP from min_dynamic_context_parallel_size up, and the whole DPxCP group; our
  layout's sizes must be among them (so 12 ranks work: 1, 2, 4, 12; 18 do not: 6 is missing);
* a packed-sequence cap (thd_max_packed_sequences) is not something our scheduler keeps.

The cost model comes from the model config (hidden size, query groups) unless coefficients are
given (the benchmark passes its own).
"""

from __future__ import annotations

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
from megatron.varlen.scheduling.groups import MIN_CP_FLAG, build_group_layout
from megatron.varlen.scheduling.problem import ScheduleProblem
from tools.upstream_port.fill_idle import fill_idle_ranks

SCHEDULER_NAME = "lpt_dynamic_cp"


def megatron_group_sizes(num_ranks: int, min_cp_size: int) -> tuple[int, ...]:
    """The dynamic CP group sizes Megatron-LM's parallel_state creates over ``num_ranks``."""
    sizes, size = [], 1
    while size < num_ranks:
        if size >= min_cp_size:
            sizes.append(size)
        size *= 2
    return (*sizes, num_ranks)


def check_scheduler_settings(dp_size: int, cp_size: int, min_cp_size: int,
                             max_num_seqs: int | None = None) -> None:
    """Raises ValueError (one line) if the scheduler cannot serve these settings."""
    if max_num_seqs is not None:
        raise ValueError(f"{SCHEDULER_NAME} does not cap the packed sequences per micro-batch "
                         f"(thd_max_packed_sequences={max_num_seqs}); unset it or use "
                         "default_dynamic_cp")
    num_ranks = dp_size * cp_size
    layout = build_group_layout(num_ranks, min_cp_size, cp_size)
    missing = sorted(set(layout.sequence_sizes) - set(megatron_group_sizes(num_ranks,
                                                                           min_cp_size)))
    if missing:
        raise ValueError(f"{SCHEDULER_NAME} on DPxCP={num_ranks} (CP {cp_size}) needs CP groups "
                         f"of {missing} ranks, which parallel_state does not create (it creates "
                         f"powers of two and all DPxCP ranks); change the DP or CP size or "
                         f"{MIN_CP_FLAG}")


def cost_model_for(model_config=None, cost_coefficients: dict | None = None) -> CostModel:
    """The cost model: explicit coefficients, else the model's sizes, else the default."""
    if cost_coefficients is not None:
        return CostModel(**cost_coefficients)
    hidden_size = getattr(model_config, "hidden_size", None)
    if hidden_size is None:
        return CostModel()
    heads = getattr(model_config, "num_attention_heads", None)
    groups = getattr(model_config, "num_query_groups", None) or heads
    return CostModel.for_model(hidden_size, kv_fraction=groups / heads if heads else 1.0)


def schedule_sample_groups(sample_id_seqlens, dp_size: int, cp_size: int,
                           max_seqlen_per_rank: int, min_cp_size: int = 1,
                           vpp_group_size: int | None = None,
                           cost: CostModel | None = None) -> list[list[list[int]]]:
    """``sample_id_groups`` of upstream's interface for ``(sample id, length)`` pairs.

    Raises:
        ValueError: settings the scheduler cannot serve (check_scheduler_settings), a sample
            longer than all DPxCP ranks hold, or fewer samples than the micro-batch count.
    """
    check_scheduler_settings(dp_size, cp_size, min_cp_size)
    pairs = [(int(sample_id), int(length)) for sample_id, length in sample_id_seqlens]
    problem = ScheduleProblem(lengths=tuple(length for _, length in pairs), dp_size=dp_size,
                              cp_size=cp_size, max_seqlen_per_rank=max_seqlen_per_rank,
                              min_cp_size=min_cp_size, vpp_group_size=vpp_group_size or 1,
                              cost=cost or CostModel())
    schedule = fill_idle_ranks(problem, default_dynamic_cp(problem))
    return [[[pairs[seq][0] for seq in ids] for ids in ranks] for ranks in schedule.microbatches]
