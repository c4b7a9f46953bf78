"""Megatron-LM's runtime / operations flags: garbage collection, the CUDA cache, profiling,
memory history, the log level, the process group's backend, deterministic mode -- honoured with
Megatron-LM's names, defaults and semantics (config/runtime.py, runtime_hooks.py,
process_settings.py) -- and the fault-tolerance families this fork does not run (straggler
detector, NVIDIA's fault-tolerance package, in-process restart, one-logger, the rerun state
machine and its checks, the DP weight-hash check), registered only to be refused in one line
(Megatron-LM's neutral values accepted).

Defaults are core_v0.16.1's (our megatron-core pin); where Megatron-LM main differs the help
says so (``--profile-ranks``: main profiles every rank by default).
"""

from __future__ import annotations

import argparse
import os

from megatron.varlen.platform import cpu_device
from megatron.varlen_training.config.runtime import (
    LOGGING_LEVEL_VARIABLE, MEMORY_SNAPSHOT_PATH, PROFILE_RANKS, PROFILE_STEP_END,
    PROFILE_STEP_START,
)
from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, refuse_given

BACKENDS = ("nccl", "gloo")
EMPTY_CACHE_LEVELS = (0, 1, 2)
# Megatron-LM main's megatron/training/determinism.py: the values its --deterministic-mode
# accepts in the environment (and sets where unset, process_settings.DETERMINISTIC_ENV).
DETERMINISTIC_NCCL_ALGOS = frozenset({"Ring", "CollnetDirect", "CollnetChain", "^NVLS"})
DETERMINISTIC_ENV_VALUES = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": frozenset({"0"}),
    "CUBLAS_WORKSPACE_CONFIG": frozenset({":4096:8", ":16:8"}),
}
DETERMINISTIC_SSM_VARIABLES = ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")

_STRAGGLER_WHY = ("Megatron-LM's straggler detector (per-rank GPU throughput over NVML) is not "
                  "built here; --timing-log-option all prints every rank's timers")
_FT_WHY = "NVIDIA's fault-tolerance package (nvidia-resiliency-ext) is not integrated here"
_INPROCESS_WHY = ("in-process restart (nvidia-resiliency-ext) is not integrated here; a failed "
                  "run resumes from its last checkpoint with --load")
_ONE_LOGGER_WHY = ("one-logger (NVIDIA's internal progress tracker) is not available here; "
                   "the run's metrics go to --tensorboard-dir, --wandb-project and "
                   "--log-metrics-jsonl")


_RERUN_WHY = ("Megatron-LM's rerun state machine is not used here: a NaN/Inf loss or grad norm "
              "stops the run at that iteration (--check-for-nan-in-loss-and-grad)")
_RERUN_MODE = "--rerun-mode"
RERUN_MODES = ("disabled", "validate_results", "report_stats")


def _inprocess_seconds(flag: str, default: float) -> FlagRow:
    return FlagRow((flag,), {"type": float}, float(default), _INPROCESS_WHY)


# Megatron-LM's default is $WORLD_SIZE, the one value that keeps no warm reserve: accepted.
_ACTIVE_WORLD = "--inprocess-active-world-size"
REFUSED_FLAGS = (
    FlagRow(("--log-straggler",), SWITCH, False, _STRAGGLER_WHY),
    FlagRow(("--disable-straggler-on-startup",), SWITCH, False, _STRAGGLER_WHY),
    FlagRow(("--straggler-ctrlr-port",), {"type": int}, 65535, _STRAGGLER_WHY),
    FlagRow(("--straggler-minmax-count",), {"type": int}, 1, _STRAGGLER_WHY),
    FlagRow(("--check-for-large-grads",), SWITCH, False,
            "Megatron-LM's rerun state machine, which runs that check, is not used here "
            "(--check-for-nan-in-loss-and-grad is honoured)"),
    FlagRow(("--enable-ft-package",), SWITCH, False, _FT_WHY),
    FlagRow(("--calc-ft-timeouts",), SWITCH, False, _FT_WHY),
    FlagRow(("--ft-num-warmup-iters",), {"type": int}, 5, _FT_WHY),
    FlagRow(("--one-logger-project",), {}, "megatron-lm", _ONE_LOGGER_WHY),
    FlagRow(("--one-logger-run-name",), {}, None, _ONE_LOGGER_WHY),
    FlagRow(("--one-logger-async",), SWITCH, False, _ONE_LOGGER_WHY),
    FlagRow(("--app-tag-run-name",), {}, None, _ONE_LOGGER_WHY),
    FlagRow(("--app-tag-run-version",), {}, "0.0.0", _ONE_LOGGER_WHY),
    FlagRow(("--inprocess-restart",), SWITCH, False, _INPROCESS_WHY),
    FlagRow(("--inprocess-max-iterations",), {"type": int}, None, _INPROCESS_WHY),
    _inprocess_seconds("--inprocess-monitor-thread-interval", 1),
    _inprocess_seconds("--inprocess-monitor-process-interval", 1),
    _inprocess_seconds("--inprocess-progress-watchdog-interval", 1),
    _inprocess_seconds("--inprocess-heartbeat-interval", 30),
    _inprocess_seconds("--inprocess-soft-timeout", 60),
    _inprocess_seconds("--inprocess-hard-timeout", 90),
    _inprocess_seconds("--inprocess-heartbeat-timeout", 60),
    _inprocess_seconds("--inprocess-barrier-timeout", 120),
    _inprocess_seconds("--inprocess-completion-timeout", 120),
    _inprocess_seconds("--inprocess-last-call-wait", 1),
    _inprocess_seconds("--inprocess-termination-grace-time", 1),
    FlagRow(("--inprocess-granularity",), {"choices": ("node", "rank")}, "node", _INPROCESS_WHY),
    FlagRow((_ACTIVE_WORLD,), {"type": int}, None, _INPROCESS_WHY),
    FlagRow(("--inprocess-empty-cuda-cache",), SWITCH, False, _INPROCESS_WHY),
    # Megatron-LM's rerun state machine (re-runs an iteration to tell a transient fault from a
    # bug); its default mode and no injected errors ask for nothing, "disabled" neither (it
    # re-runs nothing, as here: --check-for-nan-in-loss-and-grad stops the run).
    FlagRow((_RERUN_MODE,), {"choices": RERUN_MODES}, "validate_results", _RERUN_WHY,
            accepts=("disabled",)),
    FlagRow(("--error-injection-rate",), {"type": int}, 0, _RERUN_WHY),
    FlagRow(("--error-injection-type",),
            {"choices": ("correct_result", "transient_error", "persistent_error")},
            "transient_error", _RERUN_WHY),
    FlagRow(("--check-for-spiky-loss",), SWITCH, False, _RERUN_WHY),
    FlagRow(("--result-rejected-tracker-filename",), {}, None, _RERUN_WHY),
    FlagRow(("--check-weight-hash-across-dp-replicas-interval",), {"type": int}, None,
            "the weights' hashes are not compared across data-parallel replicas here"),
    # Megatron-LM main's profiling additions (newer than core_v0.16.1)
    FlagRow(("--pytorch-profiler-collect-chakra",), SWITCH, False,
            "Chakra execution traces are not collected here (the torch profiler's trace is)"),
    FlagRow(("--nvtx-ranges",), SWITCH, False,
            "this fork emits no NVTX ranges of its own (nsys still sees CUDA's)"),
)


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Registers Megatron-LM's runtime flags: the honoured ones, then the refused families."""
    _add_memory_args(parser.add_argument_group("Megatron-LM garbage collection and memory"))
    _add_profiling_args(parser.add_argument_group("Megatron-LM profiling"))
    _add_process_args(parser.add_argument_group("Megatron-LM process settings"))
    refused = parser.add_argument_group("Megatron-LM fault-tolerance flags refused here")
    # What this flag asks for is what happens here: nothing tracks the run with one-logger.
    refused.add_argument("--no-one-logger", action="store_false", dest="enable_one_logger",
                         help="Accepted: one-logger is not available here, so it never tracks "
                              "the run (the other one-logger flags are refused).")
    add_flag_rows(refused, REFUSED_FLAGS)


def _add_memory_args(group) -> None:
    group.add_argument("--manual-gc", action="store_true",
                       help="Turn Python's automatic garbage collector off and collect on every "
                            "rank at the same iterations (--manual-gc-interval, and around "
                            "evaluations), as Megatron-LM: no rank pauses alone.")
    group.add_argument("--manual-gc-interval", type=int, default=0,
                       help="With --manual-gc: collect after every N-th iteration (0: never "
                            "during training).")
    group.add_argument("--no-manual-gc-eval", "--disable-manual-gc-eval", action="store_false",
                       dest="manual_gc_eval",
                       help="With --manual-gc: no collection before and after each in-loop "
                            "evaluation (by default a full one before, a young-generation one "
                            "after).")
    group.add_argument("--empty-unused-memory-level", type=int, default=0,
                       choices=EMPTY_CACHE_LEVELS,
                       help="torch.cuda.empty_cache(): 1 after each forward-backward and "
                            "evaluation batch, 2 also after each optimizer step, 0 never "
                            "(nothing to release without CUDA).")


def _add_profiling_args(group) -> None:
    group.add_argument("--profile", action="store_true",
                       help="Profile iterations --profile-step-start to --profile-step-end on "
                            "--profile-ranks: with --use-pytorch-profiler [start, end), "
                            "else nsys's capture range (cudaProfilerStart/Stop) over (start, "
                            "end], as Megatron-LM (run under `nsys profile "
                            "--capture-range=cudaProfilerApi`; needs CUDA).")
    group.add_argument("--use-pytorch-profiler", action="store_true",
                       help="With --profile: torch.profiler (shapes and stacks recorded), its "
                            "trace under --tensorboard-dir for TensorBoard's profiler plugin "
                            "(rank<r>.*.pt.trace.json), as Megatron-LM core_v0.16.1.")
    group.add_argument("--profile-step-start", type=int, default=PROFILE_STEP_START,
                       help="First profiled iteration (see --profile).")
    group.add_argument("--profile-step-end", type=int, default=PROFILE_STEP_END,
                       help="End of the profiled iterations (see --profile).")
    group.add_argument("--profile-ranks", type=int, nargs="+", default=list(PROFILE_RANKS),
                       help="Global ranks that profile and record memory history (default 0, "
                            "Megatron-LM core_v0.16.1's; main's default profiles every rank).")
    for what in ("shapes", "callstack"):  # Megatron-LM main's switches for what 0.16.1 always did
        group.add_argument(f"--pytorch-profiler-collect-{what}", action="store_true",
                           help=f"Accepted (Megatron-LM main's flag): the torch profiler always "
                                f"collects {what} here, as Megatron-LM core_v0.16.1.")
    group.add_argument("--record-memory-history", action="store_true",
                       help="Record the CUDA caching allocator's history from start-up on "
                            "--profile-ranks and dump a snapshot every --log-interval "
                            "iterations (Megatron-LM main's; needs CUDA).")
    group.add_argument("--memory-snapshot-path", default=MEMORY_SNAPSHOT_PATH,
                       help="Memory snapshot file; rank r writes <stem>_<r><suffix> (e.g. "
                            "snapshot_0.pickle), as Megatron-LM main.")


def _add_process_args(group) -> None:
    group.add_argument("--logging-level", type=int, default=None,
                       help="Python logging level of the process (10 DEBUG, 20 INFO, 30 "
                            "WARNING, ...), as Megatron-LM; default $MEGATRON_LOGGING_LEVEL. "
                            "The training log's own lines (Megatron-LM prints them) stay at "
                            "INFO or below.")
    group.add_argument("--distributed-backend", default=None, choices=BACKENDS,
                       help="torch.distributed backend of the process group. Default: the "
                            "device's (nccl on CUDA, gloo on CPU); gloo on CUDA runs ranks "
                            "that share a GPU (no gradient-reduction overlap).")
    group.add_argument("--deterministic-mode", action="store_true",
                       help="Repeatable numbers, as Megatron-LM: "
                            "torch.use_deterministic_algorithms(True), megatron-core's "
                            "deterministic_mode, and NCCL_ALGO=Ring, "
                            "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, "
                            "CUBLAS_WORKSPACE_CONFIG=:4096:8 where unset.")
    group.add_argument("--use-cpu-initialization", action="store_true", default=None,
                       help="Accepted: always so here (weights are built and initialised on "
                            "the host, layout-invariantly, then moved to the device).")


def validate_runtime_args(args: argparse.Namespace, require) -> None:
    """Refuses what cannot run here and the settings that would silently do nothing
    (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require, skip=(_ACTIVE_WORLD,))
    active = args.inprocess_active_world_size  # Megatron-LM's default: the job's world size
    require(active is None or active == args.world_size,
            f"{_ACTIVE_WORLD} {active} is not supported: {_INPROCESS_WHY}")
    require(args.manual_gc or args.manual_gc_interval == 0,
            f"--manual-gc-interval {args.manual_gc_interval} needs --manual-gc (without it "
            f"Python's own collector runs and the interval is never used)")
    _validate_profiling(args, require)
    _validate_process_settings(args, require)


def _validate_profiling(args: argparse.Namespace, require) -> None:
    highest = args.world_size - 1
    for rank in args.profile_ranks:
        require(rank <= highest, f"--profile-ranks {rank} is not a rank of this job (ranks 0 "
                                 f"to {highest}; lower --profile-ranks)")
    require(args.profile or not args.use_pytorch_profiler,
            "--use-pytorch-profiler needs --profile (it says which profiler --profile uses)")
    on_cpu = cpu_device.use_cpu()
    require(not (args.record_memory_history and on_cpu),
            "--record-memory-history records the CUDA caching allocator, and no CUDA device is "
            "visible: drop the flag")
    if not args.profile:
        return
    start, end = args.profile_step_start, args.profile_step_end
    require(start < end, f"--profile-step-start {start} must be below --profile-step-end {end} "
                         f"(the profiled iterations run from start to end)")
    if args.use_pytorch_profiler:
        require(args.tensorboard_dir is not None,
                "--use-pytorch-profiler writes its trace under --tensorboard-dir: give one")
        last = end - 1  # torch.profiler records [start, end)
    else:
        require(not on_cpu, "--profile without --use-pytorch-profiler opens nsys's capture "
                            "range (cudaProfilerStart/Stop), which needs CUDA: add "
                            "--use-pytorch-profiler")
        last = end  # the nsys range covers (start, end]
    require(last <= args.train_iters,
            f"--profile-step-end {end} profiles up to iteration {last}, past --train-iters "
            f"{args.train_iters}: the trace would never be written (lower --profile-step-end)")


def _validate_process_settings(args: argparse.Namespace, require) -> None:
    from_env = os.environ.get(LOGGING_LEVEL_VARIABLE)
    require(args.logging_level is not None or not from_env or from_env.isdigit(),
            f"${LOGGING_LEVEL_VARIABLE}={from_env!r} is not a Python logging level (an integer "
            f">= 0: 10 DEBUG ... 50 CRITICAL): fix it, or give --logging-level")
    require(not (args.distributed_backend == "nccl" and cpu_device.use_cpu()),
            "--distributed-backend nccl needs CUDA devices, and none is visible: use gloo or "
            "leave the flag out (the device's backend)")
    if args.deterministic_mode:
        problem = deterministic_environment_problem(os.environ)
        require(problem is None, problem)
        # Megatron-LM main's ARG_VALUES_REQUIRED_FOR_DETERMINISM (--tp-comm-overlap, its other
        # entry, is refused here whatever the mode: kernel_arguments.py).
        require(not args.cross_entropy_loss_fusion,
                "--deterministic-mode with --cross-entropy-loss-fusion: the fused cross entropy "
                "is not deterministic (Megatron-LM refuses the pair too): drop one of them")


def deterministic_environment_problem(env) -> str | None:
    """Why the environment ``env`` defeats --deterministic-mode (Megatron-LM main's checks), or
    None. Unset variables are fine: process_settings sets Megatron-LM's values."""
    nccl_algo = env.get("NCCL_ALGO")
    if nccl_algo is not None:
        tokens = [token.strip() for token in nccl_algo.split(",") if token.strip()]
        if not tokens or not set(tokens) <= DETERMINISTIC_NCCL_ALGOS:
            return (f"--deterministic-mode: NCCL_ALGO={nccl_algo!r} is not a deterministic "
                    f"choice (each of {', '.join(sorted(DETERMINISTIC_NCCL_ALGOS))}; unset: "
                    f"Ring)")
    for name, accepted in DETERMINISTIC_ENV_VALUES.items():
        value = env.get(name)
        if value is not None and value not in accepted:
            return (f"--deterministic-mode: {name}={value!r} is not deterministic (one of "
                    f"{', '.join(sorted(accepted))}, or unset)")
    for name in DETERMINISTIC_SSM_VARIABLES:
        value = env.get(name)
        if value and not value.startswith("1"):
            return f"--deterministic-mode: {name}={value!r} turns SSM determinism off (unset it)"
    return None
