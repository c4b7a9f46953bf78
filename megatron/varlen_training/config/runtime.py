"""``RuntimeConfig``: how a run's processes behave around the training math -- Python's garbage
collector, the CUDA cache, the profilers, the log level, deterministic kernels -- from
Megatron-LM's runtime flags (runtime_arguments.py). None of it changes a step's numbers, except
``deterministic_mode`` which makes them repeatable."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges

# Megatron-LM's defaults (its ProfilingConfig and TrainingConfig, core_v0.16.1).
PROFILE_STEP_START = 10
PROFILE_STEP_END = 12
PROFILE_RANKS = (0,)
MEMORY_SNAPSHOT_PATH = "snapshot.pickle"
# Megatron-LM's fallback for --logging-level (its initialize.py): an integer level.
LOGGING_LEVEL_VARIABLE = "MEGATRON_LOGGING_LEVEL"


@dataclass(frozen=True)
class RuntimeConfig:
    """Megatron-LM's runtime flags, fields named as their dests.

    Attributes:
        manual_gc: Python's automatic garbage collector is off for the run; it collects every
            ``manual_gc_interval`` iterations (0: never) on every rank at once.
        manual_gc_interval: Iterations between those collections.
        manual_gc_eval: With ``manual_gc``, a full collection before each in-loop evaluation
            and a young-generation one after it.
        empty_unused_memory_level: ``torch.cuda.empty_cache()`` after each forward-backward
            (and evaluation batch) from 1, also after each optimizer step at 2; 0 never.
        profile: Profile the iterations ``[profile_step_start, profile_step_end)`` (torch
            profiler) or ``(start, end]`` (nsys range) on ``profile_ranks``.
        use_pytorch_profiler: torch.profiler, its trace under ``--tensorboard-dir``; without
            it nsys's capture range (cudaProfilerStart/Stop).
        profile_step_start: First profiled iteration (see ``profile``).
        profile_step_end: End of the profiled iterations (see ``profile``).
        profile_ranks: Global ranks that profile (and record memory history).
        record_memory_history: Record the CUDA caching allocator's history from start-up on
            ``profile_ranks``; a snapshot is dumped every ``--log-interval`` iterations.
        memory_snapshot_path: Snapshot file; rank ``r`` writes ``<stem>_<r><suffix>``.
        logging_level: Python logging level (Megatron-LM's ``--logging-level``), None: the
            ``MEGATRON_LOGGING_LEVEL`` environment variable, else unchanged.
        deterministic_mode: ``torch.use_deterministic_algorithms(True)`` and Megatron-LM's
            deterministic library settings (NCCL, cuBLAS, Transformer Engine).
        disable_jit_fuser: megatron-core's jit_fuser functions (torch.compile) run eagerly.
    """

    manual_gc: bool = False
    manual_gc_interval: int = 0
    manual_gc_eval: bool = True
    empty_unused_memory_level: int = 0
    profile: bool = False
    use_pytorch_profiler: bool = False
    profile_step_start: int = PROFILE_STEP_START
    profile_step_end: int = PROFILE_STEP_END
    profile_ranks: tuple[int, ...] = PROFILE_RANKS
    record_memory_history: bool = False
    memory_snapshot_path: str = MEMORY_SNAPSHOT_PATH
    logging_level: int | None = None
    deterministic_mode: bool = False
    disable_jit_fuser: bool = False

    def __post_init__(self):
        check_ranges(self)

    def profiles_rank(self, rank: int) -> bool:
        """Whether global rank ``rank`` profiles (and records memory history)."""
        return rank in self.profile_ranks
