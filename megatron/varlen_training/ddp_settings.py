"""megatron-core's DistributedDataParallelConfig of a run, as Megatron-LM's ``get_model`` fills
it from its flags (ddp_arguments.py has the flags and their checks)."""

from __future__ import annotations

from megatron.core.distributed import DistributedDataParallelConfig

from megatron.varlen_training.config import RunConfig


def bucket_size(run: RunConfig, num_parameters: int) -> int | None:
    """The gradient bucket size Megatron-LM asks for: ``--ddp-num-buckets K`` -> the rank's
    parameters // K, else ``--ddp-bucket-size`` (None: megatron-core's default, max(40M,
    1M x DP x CP)); None without ``--overlap-grad-reduce`` (one bucket per buffer)."""
    parallel = run.parallel
    if not parallel.overlap_grad_reduce:
        return None
    if parallel.ddp_num_buckets is not None:
        return num_parameters // parallel.ddp_num_buckets
    return parallel.ddp_bucket_size


def aligned_param_gather(run: RunConfig) -> bool:
    """Megatron-LM aligns the distributed optimizer's parameter all-gathers across pipeline
    stages under VPP only (the schedule then starts them; 1F1B without VPP cannot), unless
    ``--no-align-param-gather``."""
    parallel = run.parallel
    return parallel.virtual_pipeline_model_parallel_size is not None \
        and parallel.align_param_gather


def core_ddp_config(run: RunConfig, num_parameters: int) -> DistributedDataParallelConfig:
    """The DDP config of ``run`` whose model chunks on this rank hold ``num_parameters``."""
    parallel = run.parallel
    return DistributedDataParallelConfig(
        # Megatron-LM's: fp32 with --bf16 (unless --grad-reduce-in-bf16) or
        # --accumulate-allreduce-grads-in-fp32 (model_arguments.py resolves it).
        grad_reduce_in_fp32=run.model.accumulate_allreduce_grads_in_fp32,
        use_distributed_optimizer=run.optimizer.use_distributed_optimizer,
        overlap_grad_reduce=parallel.overlap_grad_reduce,
        overlap_param_gather=parallel.overlap_param_gather,
        align_param_gather=aligned_param_gather(run),
        bucket_size=bucket_size(run, num_parameters),
        average_in_collective=parallel.ddp_average_in_collective,
        pad_buckets_for_high_nccl_busbw=parallel.ddp_pad_buckets_for_high_nccl_busbw,
    )
