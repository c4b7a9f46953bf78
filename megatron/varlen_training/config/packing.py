"""``SequencePackingConfig``: THD packing, its scheduler and dynamic context parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges


@dataclass(frozen=True)
class SequencePackingConfig:
    """Fields named as their flags' dests, as validation resolved them: dynamic CP implies
    packing and the ``default_dynamic_cp`` scheduler, the scheduler name is canonical and the
    per-rank budget defaulted; ``variable_seq_lengths`` is False where packs must keep one
    shape (no packing, or virtual pipeline stages)."""

    sequence_packing: bool
    sequence_packing_scheduler: str | None
    max_seqlen_per_dp_cp_rank: int | None
    dynamic_context_parallel: bool
    min_dynamic_context_parallel_size: int
    hardware_profile: str
    variable_seq_lengths: bool
    validate_packing_schedules: bool = False
    # Megatron-LM's fixed THD shapes (docs/PACKING.md): "max" or N; K; the tail's layout.
    pad_packed_seq_alignment: int | str | None = None
    thd_max_packed_sequences: int | None = None
    thd_tail_padding_policy: str | None = None

    def __post_init__(self):
        check_ranges(self)
