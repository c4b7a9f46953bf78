"""``ParallelConfig``: how the run's ranks split the model and the data."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel sizes (fields named as their flags' dests) and what follows from the world
    size: ``data_parallel_size`` and the virtual pipeline size (None without VPP)."""

    world_size: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    num_layers_per_virtual_pipeline_stage: int | None
    virtual_pipeline_model_parallel_size: int | None
    context_parallel_size: int
    data_parallel_size: int
    sequence_parallel: bool
    distributed_timeout_minutes: float
    # Megatron-LM's pipeline split (pipeline_arguments.py checked it; megatron-core places the
    # layers): fixed first/last stage sizes, or the embedding / loss counted as a layer.
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    num_virtual_stages_per_pipeline_rank: int | None = None
    # --pipeline-model-parallel-layout (megatron-core's layout string, which places every layer)
    pipeline_model_parallel_layout: str | None = None
    # the interleaved schedule's micro-batch group; None: megatron-core's default, the PP size
    microbatch_group_size_per_vp_stage: int | None = None
    # megatron-core's DDP / distributed optimizer overlap (recipe_arguments.py).
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # --distributed-backend (runtime_arguments.py); None: the device's (nccl on CUDA, else gloo).
    distributed_backend: str | None = None
    # megatron-core's DDP buckets and collectives (ddp_arguments.py; ddp_settings.py maps them).
    ddp_bucket_size: int | None = None
    ddp_num_buckets: int | None = None
    ddp_average_in_collective: bool = False
    ddp_pad_buckets_for_high_nccl_busbw: bool = False
    # Which overlapped collectives the pipeline schedule starts for all stages together, and
    # whether VPP's p2p overlaps compute (resolved: False without VPP, as Megatron-LM).
    align_param_gather: bool = True
    align_grad_reduce: bool = True
    overlap_p2p_comm: bool = False

    def __post_init__(self):
        check_ranges(self)

    @property
    def sp_factor(self) -> int:
        """What sequence parallelism multiplies the padding divisor by (TP, or 1 without)."""
        return self.tensor_model_parallel_size if self.sequence_parallel else 1

    @property
    def dp_cp_size(self) -> int:
        """Ranks that share a global batch's sequences (data x context parallel)."""
        return self.data_parallel_size * self.context_parallel_size
