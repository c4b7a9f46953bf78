"""Megatron-LM's logging flags beyond those of arguments.py's logging group: honoured with
Megatron-LM's scalar names and defaults through the metric writers (metric_writers.py), or
refused in one line where this fork cannot honour them.

Megatron-LM core_v0.16.1 builds its logging group from ``LoggerConfig``
(megatron/training/training_config.py); ``--moe-per-layer-logging`` sits in its MoE group.
Megatron-LM main (newer than the megatron-core 0.16.1 this fork runs on) adds the MoE routing
trace and OpenTelemetry flags, refused here with that said. Flags Megatron-LM itself dropped
before core_v0.9.0 (``--log-batch-size-to-tensorboard``, ``--no-log-learnig-rate-to-tensorboard``:
both scalars have been written always since) are not registered: Megatron-LM 0.16.1 does not
accept them either.

Device memory (``--log-memory-to-tensorboard``, ``--log-memory-interval``,
``--log-device-memory-used``) is CUDA's allocator statistics in Megatron-LM; a CPU run has no
such counters, so there they are refused in one line rather than written as a made-up number
(device_memory.py honours them on CUDA).

``--log-progress`` appends Megatron-LM's lines to ``progress.txt`` in the ``--save`` folder
(progress_log.py); the floating-point operations it reports are kept in the checkpoints.
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, refuse_given

TENSORBOARD_QUEUE_SIZE = 1000  # Megatron-LM's default --tensorboard-queue-size
# Flags read only on CUDA: the allocator's statistics (torch.cuda.memory_stats).
CUDA_MEMORY_FLAGS = {"--log-memory-to-tensorboard": "log_memory_to_tensorboard",
                     "--log-memory-interval": "log_memory_interval",
                     "--log-device-memory-used": "log_device_memory_used"}
_NEWER = "a Megatron-LM main flag (newer than the core 0.16.1 this fork follows)"
_TRACE_WHY = f"{_NEWER}: MoE router decision traces are not recorded here"
_OTEL_WHY = f"{_NEWER}: no OpenTelemetry instrumentation here"
REFUSED_FLAGS = (
    FlagRow(("--log-energy",), SWITCH, False,
            "energy counters are NVML's (GPU only) and this fork has no energy monitor"),
    FlagRow(("--log-max-attention-logit",), SWITCH, False,
            "the THD core attentions here do not record the max attention logit (megatron-core's "
            "DotProductAttention and Transformer Engine's do)"),
    FlagRow(("--moe-routing-trace-path",), {}, None, _TRACE_WHY),
    FlagRow(("--moe-routing-trace-max-training-iters",), {"type": int}, None, _TRACE_WHY),
    FlagRow(("--moe-routing-trace-capture-logits",), SWITCH, False, _TRACE_WHY),
    FlagRow(("--moe-routing-trace-capture-hidden-states",), SWITCH, False, _TRACE_WHY),
    FlagRow(("--moe-routing-trace-dump-weights",), SWITCH, False, _TRACE_WHY),
    FlagRow(("--otel-enabled",), SWITCH, False, _OTEL_WHY),
    FlagRow(("--otel-service-name",), {}, None, _OTEL_WHY),
    FlagRow(("--otel-span-groups",), {}, None, _OTEL_WHY),
)


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's logging flags that arguments.py's group lacks (module docstring)."""
    group = parser.add_argument_group("logging (more of Megatron-LM's)")
    group.add_argument("--tensorboard-queue-size", type=int, default=TENSORBOARD_QUEUE_SIZE,
                       help="TensorBoard events held before the writer flushes them to disk "
                            "(its max_queue).")
    group.add_argument("--no-log-loss-scale-to-tensorboard",
                       "--disable-log-loss-scale-to-tensorboard", action="store_false",
                       dest="log_loss_scale_to_tensorboard",
                       help="Leave the loss scale ('loss-scale', 'loss_scale') out of "
                            "TensorBoard and wandb.")
    group.add_argument("--log-world-size-to-tensorboard", action="store_true",
                       help="Also write the world size ('world-size', 'world-size vs "
                            "samples') to TensorBoard and wandb.")
    group.add_argument("--wandb-entity", default=None,
                       help="The wandb entity (team) of the run (with --wandb-project).")
    group.add_argument("--moe-per-layer-logging", action="store_true",
                       help="Also write each MoE loss per layer ('moe/<loss>_layer_<i>', i "
                            "from 0 over decoder then MTP layers) to TensorBoard, wandb and the "
                            "JSONL record.")
    group.add_argument("--log-progress", action="store_true",
                       help="Append Megatron-LM's progress lines to progress.txt in the --save "
                            "folder (rank 0): 'Starting job' at each start, and after each "
                            "checkpoint its iteration, the job's and the cumulative TFLOP/s "
                            "per GPU, the floating-point operations so far (from the real "
                            "sample lengths, kept in the checkpoints) and Megatron-LM's tokens "
                            "(consumed samples x --seq-length). Without --save nothing is "
                            "written, as in Megatron-LM.")
    group.add_argument("--log-memory-to-tensorboard", action="store_true",
                       help="CUDA only: write the allocator's memory ('mem-reserved-bytes', "
                            "'mem-allocated-bytes', 'mem-max-allocated-bytes', "
                            "'mem-allocated-count') to TensorBoard, wandb and the JSONL record.")
    group.add_argument("--log-memory-interval", type=int, default=None,
                       help="CUDA only: print Megatron-LM's '(after N iterations) memory "
                            "(MB)' line every N iterations.")
    group.add_argument("--log-device-memory-used", action="store_true",
                       help="CUDA only: the memory line adds the device's total memory used "
                            "(torch.cuda.device_memory_used, NVML's count).")
    add_flag_rows(parser.add_argument_group("Megatron-LM logging flags refused here"),
                  REFUSED_FLAGS)


def validate_logging_args(args: argparse.Namespace, require) -> None:
    """Refused flags; the CUDA-only ones on a machine without CUDA; wandb's entity without a
    project (``require(cond, message)``)."""
    import torch

    cuda_available = torch.cuda.is_available()
    refuse_given(args, REFUSED_FLAGS, require)
    for flag, dest in CUDA_MEMORY_FLAGS.items():
        value = getattr(args, dest)
        require(cuda_available or value in (None, False),
                f"{flag}{'' if value is True else f' {value}'} needs a GPU: it reports CUDA's "
                f"allocator statistics (torch.cuda.memory_stats), which a CPU run does not "
                f"have; drop {flag}")
    require(args.wandb_entity is None or args.wandb_project is not None,
            f"--wandb-entity {args.wandb_entity!r} needs --wandb-project (the wandb project "
            f"to log to)")
