"""``LoggingConfig``: the iteration line and the metric writers (JSONL, TensorBoard, wandb)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.flag_errors import require
from megatron.varlen_training.config.validation import check_ranges

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass(frozen=True)
class LoggingConfig:
    """Which metric writers a run has (a writer is on when its setting is set) and how often
    the console line is printed. ``wandb_mode`` ``auto``: ``$WANDB_MODE`` if set, else online
    with ``$WANDB_API_KEY`` and offline without."""

    log_interval: int
    log_metrics_jsonl: str | None
    tensorboard_dir: str | None
    wandb_project: str | None
    wandb_exp_name: str | None
    wandb_save_dir: str | None
    wandb_mode: str = "auto"
    # --log-validation-ppl-to-tensorboard: the TensorBoard writer adds each evaluation's
    # perplexity (Megatron-LM's flag; without a TensorBoard writer it writes nothing, as there).
    log_validation_ppl_to_tensorboard: bool = False
    # --tensorboard-log-interval: TensorBoard and wandb get the iterations that are its
    # multiples (Megatron-LM's flag and default); the console and JSONL are not affected, nor
    # the MoE and MTP losses, which Megatron-LM writes every iteration (metric_writers.py).
    tensorboard_log_interval: int = 1
    # --log-num-zeros-in-grad: each iteration reports the zero entries of its clipped main
    # grads (megatron-core's count: one more all-reduce and host read per step).
    log_num_zeros_in_grad: bool = False
    # --log-params-norm: each iteration reports the L2 norm of the weights after its update
    # (params_norm.py: one all-reduce and host read per step).
    log_params_norm: bool = False
    # Megatron-LM's timers (step_timers.py): --timing-log-level 0/1/2 picks what is timed (0:
    # the step time only), --timing-log-option how the last rank prints them every
    # --log-interval, --log-timers-to-tensorboard adds them to the metrics record (TensorBoard,
    # wandb, JSONL); --log-throughput adds Megatron-LM's "throughput" scalar there.
    timing_log_level: int = 0
    timing_log_option: str = "minmax"
    log_timers_to_tensorboard: bool = False
    log_throughput: bool = False
    # --no-barrier-with-level-1-timing clears it: level-1 timers start after a barrier
    # (Megatron-LM's default), so they time the phase, not the wait for the slowest rank.
    barrier_with_L1_time: bool = True
    # Megatron-LM's further logging flags (logging_arguments.py). The TensorBoard writer's
    # event queue (--tensorboard-queue-size); the loss scale to TensorBoard and wandb unless
    # --no-log-loss-scale-to-tensorboard; the world size with --log-world-size-to-tensorboard.
    tensorboard_queue_size: int = 1000
    log_loss_scale_to_tensorboard: bool = True
    log_world_size_to_tensorboard: bool = False
    # --wandb-entity: the wandb run's entity (team); None: wandb's own default.
    wandb_entity: str | None = None
    # --moe-per-layer-logging: each MoE loss also per layer ("moe/<loss>_layer_<i>").
    moe_per_layer_logging: bool = False
    # CUDA only (refused on CPU at start-up): the allocator's statistics as TensorBoard/wandb
    # scalars, Megatron-LM's memory line every N iterations, the device's total memory used in
    # that line (device_memory.py).
    log_memory_to_tensorboard: bool = False
    log_memory_interval: int | None = None
    log_device_memory_used: bool = False
    # --log-progress: Megatron-LM's progress.txt in the --save folder (progress_log.py);
    # nothing is written without --save, as in Megatron-LM.
    log_progress: bool = False

    def __post_init__(self):
        check_ranges(self)
        require(self.wandb_mode in WANDB_MODES,
                f"wandb mode {self.wandb_mode!r}: choose from {', '.join(WANDB_MODES)}")
