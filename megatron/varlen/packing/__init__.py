"""The packing path of one global batch: gather lengths, schedule, reroute samples, pack THD
micro-batches (fixed THD shapes on request: :mod:`~megatron.varlen.packing.thd_shapes`), split
them for their CP groups, and hand the model its inputs with declared host metadata
(:class:`VarlenPackedSeqParams`). Also the mock length distributions (torch-free).

:class:`GlobalBatchPacker` is the service both entry points use; :class:`HybridCPDataLoaderWrapper`
is Megatron-LM's API over it. Names are imported on first use (:mod:`megatron.varlen.lazy_exports`).
"""

from megatron.varlen.lazy_exports import lazy_exports

_CP_SPLIT = "megatron.varlen.packing.cp_split"
_DATA_SCHEDULE = "megatron.varlen.packing.data_schedule"
_PACKED_SEQ = "megatron.varlen.packing.packed_seq"
_THD = "megatron.varlen.packing.thd_microbatch"
_SHAPES = "megatron.varlen.packing.thd_shapes"
_EXPORTS = {
    "split_sbhd_for_cp": _CP_SPLIT, "split_thd_for_cp": _CP_SPLIT,
    "GlobalBatchPacker": _DATA_SCHEDULE, "HybridCPDataLoaderWrapper": _DATA_SCHEDULE,
    "PackingConfig": _DATA_SCHEDULE, "StepBatches": _DATA_SCHEDULE,
    "parse_length_config": "megatron.varlen.packing.length_distributions",
    "MicroBatchCache": _PACKED_SEQ, "VarlenPackedSeqParams": _PACKED_SEQ,
    "host_to_device": _PACKED_SEQ, "varlen_packed_seq_params": _PACKED_SEQ,
    "DUMMY_SEQUENCE_TOKENS": _THD, "build_model_inputs": _THD,
    "InvalidScheduleError": "megatron.varlen.packing.schedule_check",
    "ALIGN_TO_BUDGET": _SHAPES, "APPEND_DUMMY_SEQ": _SHAPES, "EXTEND_LAST": _SHAPES,
    "TAIL_PADDING_POLICIES": _SHAPES, "ThdShape": _SHAPES,
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
