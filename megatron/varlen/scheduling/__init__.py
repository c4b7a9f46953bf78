"""Sequence-packing schedulers for variable-length training (pure computation, torch-free).

Public API (see docs/SCHEDULING.md):

* problem and result: :class:`ScheduleProblem`, :class:`Schedule`, the padding rule;
* cost model: :class:`CostModel`, hardware profiles; a sequence's attention in squared tokens
  (:func:`attention_area`, :func:`length_sums`: full or through a sliding window);
* groups: :class:`GroupLayout`, :func:`build_group_layout`, :func:`build_static_layout`;
* schedulers: :func:`get_scheduler`, their names, aliases (registry.py) and the flag's help;
* checks and numbers: :func:`validate_schedule`, :func:`rank_times`, :func:`critical_path`;
* pipeline: :func:`order_for_pipeline`.

The lower bounds, bubble estimate and benchmark summaries live in tools/scheduling/.
"""

from megatron.varlen.scheduling.attention_area import attention_area, length_sums
from megatron.varlen.scheduling.cost_model import PROFILES, CostModel, HardwareProfile
from megatron.varlen.scheduling.cost_model import resolve_hardware_profile
from megatron.varlen.scheduling.groups import GroupLayout, build_group_layout, build_static_layout
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem, pad_multiple
from megatron.varlen.scheduling.problem import padded_length
from megatron.varlen.scheduling.registry import (
    DP_BALANCED, DYNAMIC_CP, canonical_name, get_scheduler, scheduler_help, scheduler_names,
)
from megatron.varlen.scheduling.schedule_evaluation import critical_path, rank_times
from megatron.varlen.scheduling.validate import idle_rank_slots, validate_schedule

__all__ = [
    "DP_BALANCED", "DYNAMIC_CP", "PROFILES", "CostModel", "GroupLayout", "HardwareProfile",
    "Schedule", "ScheduleProblem", "attention_area", "build_group_layout", "build_static_layout",
    "canonical_name", "critical_path", "get_scheduler", "idle_rank_slots", "length_sums",
    "order_for_pipeline", "pad_multiple", "padded_length", "rank_times",
    "resolve_hardware_profile", "scheduler_help", "scheduler_names", "validate_schedule",
]
