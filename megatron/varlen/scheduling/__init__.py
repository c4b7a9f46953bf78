"""Sequence-packing schedulers for variable-length training (pure computation, torch-free).

Public API (see docs/SCHEDULING.md):

* problem and result: :class:`ScheduleProblem`, :class:`Schedule`, :func:`padded_length`;
* cost model: :class:`CostModel`, :class:`HardwareProfile`, ``PROFILES``;
* groups: :class:`GroupLayout`, :func:`build_group_layout`, :func:`build_static_layout`;
* schedulers: :func:`get_scheduler` ("dp_balanced", "empty", "default_dynamic_cp"; "default" is
  an alias of "dp_balanced", see registry.py);
* checks and numbers: :func:`validate_schedule`, :func:`rank_times`, :func:`critical_path`;
* pipeline: :func:`order_for_pipeline`.

The lower bounds, the bubble estimate and the summary numbers of the benchmark live with the
tools (tools/scheduling/): training never needs them.
"""

from megatron.varlen.scheduling.cost_model import PROFILES, CostModel, HardwareProfile
from megatron.varlen.scheduling.groups import GroupLayout, build_group_layout, build_static_layout
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem, padded_length
from megatron.varlen.scheduling.registry import get_scheduler, scheduler_names
from megatron.varlen.scheduling.schedule_evaluation import critical_path, rank_times
from megatron.varlen.scheduling.validate import idle_rank_slots, validate_schedule

__all__ = [
    "PROFILES", "CostModel", "GroupLayout", "HardwareProfile", "Schedule", "ScheduleProblem",
    "build_group_layout", "build_static_layout", "critical_path", "get_scheduler",
    "idle_rank_slots", "order_for_pipeline", "padded_length", "rank_times", "scheduler_names",
    "validate_schedule",
]
