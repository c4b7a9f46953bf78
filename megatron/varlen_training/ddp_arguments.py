"""Megatron-LM's data-parallel (DDP), gradient-reduction and pipeline-communication flags (its
``_add_distributed_args`` and ``--grad-reduce-in-bf16``): honoured through megatron-core's
DistributedDataParallelConfig and TransformerConfig as Megatron-LM's ``get_model`` and
``core_transformer_config_from_args`` set them (ddp_settings.py), or refused in one line.

Honoured:

- ``--ddp-bucket-size N`` / ``--ddp-num-buckets K`` (one or the other): the gradient bucket
  size, ``K`` buckets meaning the rank's parameters // K; like every bucket size it applies
  with ``--overlap-grad-reduce`` only (without it one bucket per buffer, as Megatron-LM).
- ``--ddp-average-in-collective``: the reduction averages (ReduceOp.AVG) instead of dividing
  before a sum; NCCL only (gloo has no AVG), and not with ``--calculate-per-token-loss``
  (megatron-core asserts: the per-token loss divides by the global token count instead).
- ``--ddp-pad-buckets-for-high-nccl-busbw``: bucket sizes padded for NCCL's bus bandwidth.
- ``--grad-reduce-in-bf16``: with ``--bf16``, gradients accumulate and reduce in bf16 instead
  of fp32 (model_arguments.py resolves --accumulate-allreduce-grads-in-fp32).
- ``--no-align-param-gather`` / ``--no-align-grad-reduce``: the schedule no longer starts the
  parameter all-gathers (VPP with ``--overlap-param-gather``) or the gradient reductions
  (``--overlap-grad-reduce``) of all pipeline stages together; DDP's own hooks do.
- ``--no-overlap-p2p-communication`` (and the older ``--overlap-p2p-communication``): under
  VPP the pipeline's sends and receives overlap compute by default, as Megatron-LM; without
  VPP never (megatron-core's non-interleaved schedule cannot).

Accepted, no effect (Megatron-LM reads them only with Megatron FSDP or torch FSDP2, which are
refused here): the FSDP tuning flags. Refused: FSDP itself, the optimizer instances and groups
this fork does not create, and the overlap of the parameter gather with the optimizer step,
which Megatron-LM itself refuses with distributed (torch_dist) checkpoints, the only format
here.
"""

from __future__ import annotations

import argparse
import os

from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, accepted_rows, add_flag_rows, read_only_with, refuse_given,
)

_FSDP_WHY = ("this fork wraps the model in megatron-core's DistributedDataParallel (with "
             "--use-distributed-optimizer for sharded optimizer state); FSDP is not built")
_GROUPS_WHY = "this fork creates megatron-core's standard process groups only"
REFUSED_FLAGS = (
    FlagRow(("--use-torch-fsdp2",), SWITCH, False, _FSDP_WHY),
    FlagRow(("--use-megatron-fsdp",), SWITCH, False, _FSDP_WHY),
    FlagRow(("--num-distributed-optimizer-instances",), {"type": int}, 1,
            "the distributed optimizer shards over the whole data-parallel group here (one "
            "instance; megatron-core would need its intra/inter-instance groups)"),
    FlagRow(("--overlap-param-gather-with-optimizer-step",), SWITCH, False,
            "Megatron-LM refuses it with distributed checkpointing (torch_dist), the one "
            "checkpoint format here; use --overlap-param-gather"),
    FlagRow(("--ddp-reduce-scatter-with-fp32-accumulation",), SWITCH, False,
            "megatron-core 0.16.1's DistributedDataParallelConfig has no such field"),
    FlagRow(("--ddp-param-name-patterns-for-fp32-local-accumulation",), {"nargs": "+"}, None,
            "Megatron-LM main only; not in megatron-core 0.16.1"),
    FlagRow(("--create-all-gather-group",), SWITCH, False, _GROUPS_WHY),
    FlagRow(("--use-sharp",), SWITCH, False, _GROUPS_WHY),
    FlagRow(("--sharp-enabled-group",), {}, None, _GROUPS_WHY),
    FlagRow(("--nccl-communicator-config-path",), {}, None, _GROUPS_WHY),
    FlagRow(("--use-tp-pp-dp-mapping",), SWITCH, False,
            "ranks are ordered tensor-context-data-pipeline here (megatron-core's default order)"),
    FlagRow(("--fake-process-group",), SWITCH, False,
            "runs need a real process group (gloo on CPU)"),
    FlagRow(("--use-nccl-ub",), {"action": "store_true", "dest": "nccl_ub"}, False,
            "NCCL user-buffer registration is not set up here"),
    FlagRow(("--distributed-timeout-seconds-after-init",), {"type": int}, None,
            "the process groups keep --distributed-timeout-minutes for the whole run here"),
    # core_v0.16.1 takes a value (type=bool), main a bare switch: both spellings parse.
    FlagRow(("--lazy-mpu-init",), {"type": bool, "nargs": "?", "const": True}, None,
            "model-parallel state is always initialised at start-up here"),
)
# Read by Megatron-LM only with --use-megatron-fsdp / --use-torch-fsdp2 (refused here): without
# FSDP Megatron-LM ignores them too.
_UNREAD = read_only_with("--use-megatron-fsdp / --use-torch-fsdp2")
_FSDP_ONLY_FLAGS = accepted_rows(
    FlagRow(("--data-parallel-sharding-strategy",),
            {"choices": ("no_shard", "optim", "optim_grads", "optim_grads_params")}, "no_shard",
            _UNREAD),
    FlagRow(("--outer-dp-sharding-strategy",), {"choices": ("no_shard", "optim")}, "no_shard",
            _UNREAD),
    FlagRow(("--torch-fsdp2-no-reshard-after-forward",),
            {"action": "store_false", "dest": "torch_fsdp2_reshard_after_forward"}, True, _UNREAD),
    FlagRow(("--no-gradient-reduce-div-fusion",),
            {"action": "store_false", "dest": "gradient_reduce_div_fusion"}, True, _UNREAD),
    FlagRow(("--fsdp-double-buffer",), SWITCH, False, _UNREAD),
    FlagRow(("--suggested-communication-unit-size",), {"type": int}, None, _UNREAD),
    FlagRow(("--keep-fp8-transpose-cache",), SWITCH, False, _UNREAD),
    FlagRow(("--enable-full-sharding-in-hsdp",), SWITCH, False, _UNREAD),
    FlagRow(("--disable-symmetric-registration",), SWITCH, False, _UNREAD),
    FlagRow(("--fsdp-manual-registration",), SWITCH, False, _UNREAD),
    FlagRow(("--megatron-fsdp-version",), {"type": int, "choices": (1, 2)}, 1, _UNREAD),
)


def add_ddp_args(parser: argparse.ArgumentParser) -> None:
    """Registers the DDP, gradient-reduction and pipeline-communication flags."""
    group = parser.add_argument_group("data-parallel gradients and pipeline communication")
    group.add_argument("--ddp-bucket-size", type=int, default=None,
                       help="Parameters per gradient bucket with --overlap-grad-reduce "
                            "(default max(40M, 1M x data-parallel size), megatron-core's).")
    group.add_argument("--ddp-num-buckets", type=int, default=None,
                       help="Instead of --ddp-bucket-size: this many buckets (the rank's "
                            "parameters // this), with --overlap-grad-reduce.")
    group.add_argument("--ddp-average-in-collective", action="store_true",
                       help="Average gradients in the data-parallel collective (NCCL's AVG) "
                            "instead of scaling them before a sum.")
    group.add_argument("--ddp-pad-buckets-for-high-nccl-busbw", action="store_true",
                       help="Pad gradient buckets to sizes with high NCCL bus bandwidth.")
    group.add_argument("--grad-reduce-in-bf16", action="store_true",
                       help="With --bf16: accumulate and reduce gradients in bf16 (not fp32).")
    group.add_argument("--no-align-param-gather", action="store_false",
                       dest="align_param_gather",
                       help="VPP with --overlap-param-gather: each stage starts its parameter "
                            "all-gathers itself instead of all stages together.")
    group.add_argument("--no-align-grad-reduce", action="store_false",
                       dest="align_grad_reduce",
                       help="--overlap-grad-reduce: DDP's hooks start each reduction instead of "
                            "the pipeline schedule, for all stages together.")
    group.add_argument("--no-overlap-p2p-communication", action="store_false",
                       dest="overlap_p2p_comm",
                       help="VPP: send and receive pipeline activations without overlapping "
                            "compute (batched on GPU); without VPP they never overlap.")
    group.add_argument("--overlap-p2p-communication", action="store_true",
                       dest="overlap_p2p_comm",
                       help="Megatron-LM's older spelling of the default (overlap under VPP).")
    group.set_defaults(overlap_p2p_comm=True)
    group.add_argument("--local-rank", type=int, default=None,
                       help="Accepted from launchers that pass it when it agrees with "
                            "$LOCAL_RANK, which picks the rank's device here.")
    group.add_argument("--no-scatter-gather-tensors-in-pipeline", action="store_false",
                       dest="scatter_gather_tensors_in_pipeline",
                       help="Accepted, no effect: Megatron-LM core_v0.16.1 no longer reads it.")
    add_flag_rows(group, _FSDP_ONLY_FLAGS)
    add_flag_rows(parser.add_argument_group("Megatron-LM distributed flags refused here"),
                  REFUSED_FLAGS)


def validate_ddp_args(args: argparse.Namespace, require) -> None:
    """Refuses what megatron-core cannot do here; resolves the pipeline-communication flags
    as Megatron-LM's validate_args does (``require(cond, message)``)."""
    import torch  # the flag layer imports torch only here, as arguments.py does

    refuse_given(args, REFUSED_FLAGS, require)
    launcher_rank = int(os.environ.get("LOCAL_RANK", "0"))
    require(args.local_rank is None or args.local_rank == launcher_rank,
            f"--local-rank {args.local_rank} disagrees with $LOCAL_RANK {launcher_rank}, which "
            f"picks this rank's device here: launch with torchrun (or drop --local-rank)")
    require(args.ddp_bucket_size is None or args.ddp_num_buckets is None,
            f"--ddp-bucket-size {args.ddp_bucket_size} and --ddp-num-buckets "
            f"{args.ddp_num_buckets} both set the gradient bucket size: give one")
    if args.ddp_average_in_collective:
        require(not args.calculate_per_token_loss,
                "--ddp-average-in-collective cannot be used with --calculate-per-token-loss "
                "(or the packing modes that need it): the per-token loss divides by the "
                "global token count, not the data-parallel size (megatron-core asserts)")
        require(torch.cuda.is_available(),
                "--ddp-average-in-collective needs NCCL: gloo (CPU) has no AVG reduction; "
                "drop the flag on CPU")
    require(args.virtual_pipeline_model_parallel_size is None or args.overlap_p2p_comm
            or args.pipeline_model_parallel_size > 2,
            f"--no-overlap-p2p-communication with virtual pipeline stages needs "
            f"--pipeline-model-parallel-size > 2 (got {args.pipeline_model_parallel_size}), as "
            f"in Megatron-LM: batched sends and receives between the same two ranks")
    if args.virtual_pipeline_model_parallel_size is None:
        # Megatron-LM: the non-interleaved schedule overlaps no p2p and aligns no gathers.
        args.overlap_p2p_comm = False
        args.align_param_gather = False
