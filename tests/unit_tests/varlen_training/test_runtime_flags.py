"""Megatron-LM's runtime flags (runtime_arguments.py, runtime_hooks.py, process_settings.py).

References are Megatron-LM's semantics, counted or observed independently of the code under
test: the calls made to Python's collector and to ``torch.cuda.empty_cache`` during real runs
(recorded by stand-ins, in the order the steps ran), the iterations the torch profiler's trace
holds (its own ``ProfilerStep#`` markers, or markers the test puts in each step), the backend
``init_process_group`` receives, the logging levels and torch's deterministic switch as Python
and torch report them, and one line with exit code 2 for each refusal.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training import log, process_settings, runtime_arguments, runtime_hooks
from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.config.runtime import RuntimeConfig
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer, train_on_this_rank

REPO = Path(__file__).resolve().parents[3]
BASE = TINY_GPT_ARGS + ["--train-iters", "6"]
TIMEOUT_S = 240


def _parse(*extra: str, world: int = 1):
    return parse_run_config(BASE + list(extra), world_size=world)


# --- manual garbage collection ------------------------------------------------------------


FULL, YOUNG, STEP, SAVE = ("collect", 2), ("collect", 0), ("step",), ("save",)


class _RecordingGC:
    """Python's gc for runtime_hooks, recording each collection (and each training step, put
    in the same list by :func:`_gc_events`) in the order they happen."""

    def __init__(self, events: list):
        self.events = events

    def collect(self, generation: int = 2):
        self.events.append(("collect", generation))
        return gc.collect(generation)

    def __getattr__(self, name):  # disable, enable, isenabled: the real ones
        return getattr(gc, name)


def _gc_events(argv: list[str]) -> dict:
    """Trains ``argv`` through pretrain(); the collections and steps in order, whether the
    automatic collector was on during each step, and after the run."""
    from megatron.varlen_training import training
    from megatron.varlen_training.trainer import Trainer

    events, enabled_in_steps = [], []
    original_gc, original_step = runtime_hooks.gc, training.train_step
    original_save = Trainer.save_if_due

    def step(*args, **kwargs):
        events.append(STEP)
        enabled_in_steps.append(gc.isenabled())
        return original_step(*args, **kwargs)

    def save_if_due(trainer):  # where the loop checkpoints (each iteration, if due)
        events.append(SAVE)
        return original_save(trainer)

    runtime_hooks.gc, training.train_step = _RecordingGC(events), step
    Trainer.save_if_due = save_if_due
    try:
        train_on_this_rank(argv)
    finally:
        runtime_hooks.gc, training.train_step = original_gc, original_step
        Trainer.save_if_due = original_save
    return {"events": events, "enabled_in_steps": enabled_in_steps,
            "enabled_after": gc.isenabled()}


def _gc_runs(_unused=None) -> list[dict]:
    evaluating = ["--eval-iters", "1", "--eval-interval", "3"]
    return [_gc_events(BASE + evaluating + extra) for extra in (
        ["--manual-gc", "--manual-gc-interval", "2"],
        ["--manual-gc", "--no-manual-gc-eval"],
        [],
    )]


def test_manual_gc_collects_at_megatron_lms_points_only():
    """Megatron-LM: gc.disable() and a full collection as the loop starts; a full collection
    at the end of every --manual-gc-interval-th iteration (after its evaluation, before its
    checkpoint: post_training_step_callbacks); around each in-loop evaluation a full one before
    and a young-generation one after (not with --no-manual-gc-eval)."""
    interval_2, no_eval, automatic = run_distributed(_gc_runs, 1, timeout_s=TIMEOUT_S)[0]
    evaluation = [FULL, YOUNG]  # after iterations 3 and 6 (--eval-interval 3)
    assert interval_2["events"] == [
        FULL, STEP, SAVE, STEP, FULL, SAVE, STEP, *evaluation, SAVE, STEP, FULL, SAVE,
        STEP, SAVE, STEP, *evaluation, FULL, SAVE]
    assert no_eval["events"] == [FULL] + [STEP, SAVE] * 6
    assert automatic["events"] == [STEP, SAVE] * 6
    for run in (interval_2, no_eval):
        assert run["enabled_in_steps"] == [False] * 6 and run["enabled_after"]
    assert automatic["enabled_in_steps"] == [True] * 6


def test_manual_gc_interval_without_manual_gc_is_refused():
    with pytest.raises(ArgumentValidationError, match="--manual-gc-interval 5 needs --manual-gc"):
        _parse("--manual-gc-interval", "5")


# --- empty_cache and deterministic mode in real steps ----------------------------------------


def _cache_and_determinism(_unused=None) -> dict:
    """For levels 0, 1, 2 (the last with --deterministic-mode): torch.cuda.empty_cache calls
    over 2 training steps and one 2-batch evaluation, and the steps' losses."""
    from megatron.varlen_training import training

    out = {}
    for level, extra in ((0, []), (1, []), (2, ["--deterministic-mode"])):
        argv = BASE + ["--eval-iters", "2", "--empty-unused-memory-level", str(level), *extra]
        with stepping_trainer(argv) as (trainer, state, provider):
            calls, original = [], torch.cuda.empty_cache
            torch.cuda.empty_cache = lambda: calls.append(1)  # after start: the CPU layer's own
            try:
                losses = [trainer.step(provider.step_batches(i)).loss for i in range(2)]
                after_steps = len(calls)
                training.evaluate(trainer.run, state, provider, 0)
            finally:
                torch.cuda.empty_cache = original
            out[level] = {"steps": after_steps, "evaluation": len(calls) - after_steps,
                          "losses": losses,
                          "deterministic": torch.are_deterministic_algorithms_enabled(),
                          "config_deterministic": state.config.deterministic_mode}
    return out


def test_empty_cache_at_megatron_lms_points_and_deterministic_steps():
    """Level 1: after each forward-backward and each evaluation batch; level 2: also after each
    optimizer step (Megatron-LM's train_step / evaluate). --deterministic-mode turns torch's
    switch and megatron-core's config field on, and changes no number on CPU."""
    runs = run_distributed(_cache_and_determinism, 1, timeout_s=TIMEOUT_S)[0]
    assert {level: (run["steps"], run["evaluation"]) for level, run in runs.items()} == {
        0: (0, 0), 1: (2, 2), 2: (4, 2)}
    assert not runs[1]["deterministic"] and not runs[1]["config_deterministic"]
    assert runs[2]["deterministic"] and runs[2]["config_deterministic"]
    assert runs[2]["losses"] == runs[0]["losses"]


# --- the torch profiler and nsys's range --------------------------------------------------


def _profiled_run(trace_dir: str) -> dict:
    argv = TINY_GPT_ARGS + ["--train-iters", "5", "--profile", "--use-pytorch-profiler",
                            "--profile-step-start", "2", "--profile-step-end", "4",
                            "--profile-ranks", "1", "--tensorboard-dir", trace_dir]
    return train_on_this_rank(argv)


def _trace_events(path: Path) -> set[str]:
    return {event.get("name", "") for event in json.loads(path.read_text())["traceEvents"]}


def test_torch_profiler_traces_the_window_on_the_ranks_asked(tmp_path):
    """Two DP ranks, --profile-ranks 1, window [2, 4): one trace, rank 1's, holding profiler
    steps 2 and 3 only (a run from iteration 0: profiler step k is iteration k)."""
    run_distributed(_profiled_run, 2, args=(str(tmp_path),), timeout_s=TIMEOUT_S)
    traces = sorted(tmp_path.glob("*.pt.trace.json"))
    assert [path.name.split(".")[0] for path in traces] == ["rank1"], traces
    steps = {name for name in _trace_events(traces[0]) if name.startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}


def _drive(hook, completed_before: int, iterations: int) -> None:
    """What the Trainer does around ``iterations`` steps after ``completed_before``, each step
    a small matmul marked with its iteration number."""
    for completed in range(completed_before, completed_before + iterations):
        hook.step(completed)
        with torch.profiler.record_function(f"iteration {completed + 1}"):
            torch.ones(8, 8) @ torch.ones(8, 8)
        hook.after_step(completed + 1)
    hook.close()


@pytest.mark.parametrize("resumed_after, steps, expected", [
    (0, 4, {2, 3, 4}), (3, 4, {4}), (5, 4, set()), (0, 3, {2, 3}), (0, 1, set())])
def test_torch_profiler_window_is_by_iteration_number(tmp_path, resumed_after, steps, expected):
    """[2, 5) from a fresh run, from a run resumed after iteration 3 (what is left), from one
    resumed past the window (no trace), and from runs stopped early: inside the window (what
    was recorded) and before it (no trace)."""
    window = runtime_hooks.TorchProfilerWindow(2, 5, str(tmp_path), rank=0)
    _drive(window, resumed_after, steps)
    traces = list(tmp_path.glob("rank0.*.pt.trace.json"))
    assert len(traces) == (1 if expected else 0)
    if expected:
        names = _trace_events(traces[0])
        assert {int(name.split()[1]) for name in names if name.startswith("iteration ")} \
            == expected


def test_nsys_range_opens_after_start_and_closes_after_end():
    """Megatron-LM: cudaProfilerStart at the top of the loop when iteration == start,
    cudaProfilerStop after the step that makes iteration == end: (start, end]."""
    events = []
    nsys = runtime_hooks.NsysCaptureRange(2, 4, lambda: events.append("open"),
                                          lambda: events.append("close"))
    for completed in range(6):
        nsys.step(completed)
        events.append(completed + 1)
        nsys.after_step(completed + 1)
    nsys.close()
    assert events == [1, 2, "open", 3, 4, "close", 5, 6]


@pytest.mark.parametrize("extra, needle", [
    (["--profile", "--use-pytorch-profiler"], "--use-pytorch-profiler writes its trace under "
                                              "--tensorboard-dir"),
    (["--use-pytorch-profiler"], "--use-pytorch-profiler needs --profile"),
    (["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb",
      "--profile-step-start", "3", "--profile-step-end", "3"],
     "--profile-step-start 3 must be below --profile-step-end 3"),
    (["--profile", "--use-pytorch-profiler", "--tensorboard-dir", "tb",
      "--profile-step-start", "3", "--profile-step-end", "8"],
     "--profile-step-end 8 profiles up to iteration 7, past --train-iters 6"),
    (["--profile-ranks", "0", "2"], "--profile-ranks 2 is not a rank of this job (ranks 0 to 1"),
    (["--profile-ranks", "-1"], "--profile-ranks must be >= 0 (got -1)"),
])
def test_profiling_flags_that_would_do_nothing_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        _parse(*extra, world=2)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusals")
@pytest.mark.parametrize("extra, needle", [
    (["--profile"], "--profile without --use-pytorch-profiler opens nsys's capture range"),
    (["--record-memory-history"], "--record-memory-history records the CUDA caching"),
    (["--distributed-backend", "nccl"], "--distributed-backend nccl needs CUDA devices"),
])
def test_what_needs_cuda_is_refused_on_cpu(extra, needle):
    with pytest.raises(ArgumentValidationError, match=needle):
        _parse(*extra)


def test_memory_history_records_from_start_and_dumps_at_megatron_lms_points(monkeypatch):
    """Recording on the profiled ranks only, from start-up; a snapshot after the first step and
    every --log-interval (Megatron-LM main), named per rank; recording off at the end. CUDA's
    allocator calls are stand-ins here (CPU refuses the flag)."""
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kwargs: calls.append(("record", enabled)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: calls.append(("dump", path)))
    runtime = RuntimeConfig(record_memory_history=True, profile_ranks=(1,),
                            memory_snapshot_path="out/snap.pickle")
    for rank in (0, 1):
        hooks = runtime_hooks.StepHooks(runtime, rank, log_interval=3, tensorboard_dir=None)
        hooks.start()
        for completed in range(7):
            hooks.before_step(completed)
            calls.append(("step", rank, completed + 1))
            hooks.after_step(completed + 1)
        hooks.close()
    dump = ("dump", "out/snap_1.pickle")  # Megatron-LM main's <stem>_<rank><suffix>
    assert calls == [("step", 0, n) for n in range(1, 8)] + [
        ("record", "all"), ("step", 1, 1), dump, ("step", 1, 2), ("step", 1, 3), dump,
        ("step", 1, 4), ("step", 1, 5), ("step", 1, 6), dump, ("step", 1, 7), ("record", None)]


# --- process group backend, logging level, deterministic mode ------------------------------


class _Stop(Exception):
    pass


@pytest.mark.parametrize("extra, expected", [([], "device"), (["--distributed-backend", "gloo"],
                                                             "gloo")])
def test_distributed_backend_reaches_the_process_group(monkeypatch, extra, expected):
    """The flag's backend is the one init_process_group gets; unset, the device's (made nccl
    here, so that the flag's gloo is told apart from CPU's default)."""
    from megatron.varlen.platform import cpu_device
    from megatron.varlen_training import initialize

    received = []

    def init_process_group(backend, **kwargs):
        received.append(backend)
        raise _Stop

    monkeypatch.setattr(cpu_device, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    run = _parse(*extra)
    assert run.parallel.distributed_backend == (None if expected == "device" else expected)
    with pytest.raises(_Stop):
        initialize.initialize_megatron(run)
    assert received == ["nccl" if expected == "device" else expected]


@pytest.fixture
def restored_log_levels():
    names = ("", log.LOGGER_NAME, log.ENGINE_LOGGER_NAME)
    saved = {name: logging.getLogger(name).level for name in names}
    log.get_logger()  # the handler and the default levels exist first
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("flag, env, root, training_log", [
    (10, None, 10, 10),   # DEBUG: more detail everywhere
    (30, None, 30, 20),   # WARNING: libraries quieter; the training log's lines stay (prints)
    (None, "40", 40, 20),  # Megatron-LM's fallback: $MEGATRON_LOGGING_LEVEL
    (10, "40", 10, 10),   # the flag wins
])
def test_logging_level_is_applied_as_megatron_lm(monkeypatch, restored_log_levels, flag, env,
                                                 root, training_log):
    if env is None:
        monkeypatch.delenv(process_settings.LOGGING_LEVEL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(process_settings.LOGGING_LEVEL_VARIABLE, env)
    argv = [] if flag is None else ["--logging-level", str(flag)]
    process_settings.apply_process_settings(_parse(*argv).runtime)
    assert logging.getLogger().level == root
    assert logging.getLogger(log.ENGINE_LOGGER_NAME).level == root  # megatron-core's
    assert logging.getLogger(log.LOGGER_NAME).level == training_log


def test_a_logging_level_variable_that_is_no_level_is_one_line(monkeypatch):
    monkeypatch.setenv(process_settings.LOGGING_LEVEL_VARIABLE, "DEBUG")
    with pytest.raises(ArgumentValidationError, match="MEGATRON_LOGGING_LEVEL='DEBUG' is not"):
        _parse()
    _parse("--logging-level", "10")  # the flag wins: the variable is not read


def test_no_logging_level_leaves_the_levels(monkeypatch, restored_log_levels):
    monkeypatch.delenv(process_settings.LOGGING_LEVEL_VARIABLE, raising=False)
    before = logging.getLogger().level, logging.getLogger(log.LOGGER_NAME).level
    process_settings.apply_process_settings(RuntimeConfig())
    assert (logging.getLogger().level, logging.getLogger(log.LOGGER_NAME).level) == before


@pytest.fixture
def restored_determinism():
    yield
    torch.use_deterministic_algorithms(False)


def test_deterministic_mode_sets_torch_and_megatron_lms_environment(monkeypatch,
                                                                    restored_determinism):
    for name in process_settings.DETERMINISTIC_ENV:  # unset, and restored after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a deterministic choice: kept
    process_settings.apply_process_settings(_parse("--deterministic-mode").runtime)
    assert torch.are_deterministic_algorithms_enabled()
    assert {name: os.environ[name] for name in process_settings.DETERMINISTIC_ENV} == {
        "NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":16:8"}


@pytest.mark.parametrize("name, value", [("NCCL_ALGO", "Tree"), ("NCCL_ALGO", "Ring,Tree"),
                                         ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1"),
                                         ("CUBLAS_WORKSPACE_CONFIG", ":0:0"),
                                         ("MAMBA_DETERMINISTIC", "0")])
def test_deterministic_mode_refuses_a_nondeterministic_environment(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ArgumentValidationError) as err:
        _parse("--deterministic-mode")
    assert f"{name}={value!r}" in str(err.value) and "\n" not in str(err.value)
    _parse()  # without the flag the environment is the user's business


def test_deterministic_mode_refuses_the_fused_cross_entropy():
    """Megatron-LM main's --deterministic-mode requires cross_entropy_loss_fusion=False."""
    with pytest.raises(ArgumentValidationError) as err:
        _parse("--deterministic-mode", "--cross-entropy-loss-fusion")
    assert "--deterministic-mode with --cross-entropy-loss-fusion" in str(err.value)
    assert "\n" not in str(err.value)
    _parse("--cross-entropy-loss-fusion")  # each alone is fine


# --- accepted as they are, and refused families --------------------------------------------


def test_flags_that_ask_for_what_happens_anyway_are_accepted():
    run = _parse("--use-cpu-initialization", "--no-one-logger",
                 "--pytorch-profiler-collect-shapes", "--pytorch-profiler-collect-callstack")
    assert run.flag_values["use_cpu_initialization"] is True
    assert run.flag_values["enable_one_logger"] is False


REFUSED_ROWS = {row.flag: row for row in runtime_arguments.REFUSED_FLAGS}
ASKING = {"--straggler-ctrlr-port": "1234", "--straggler-minmax-count": "16",
          "--ft-num-warmup-iters": "0", "--one-logger-project": "mine",
          "--one-logger-run-name": "run", "--app-tag-run-name": "app",
          "--app-tag-run-version": "1.0", "--inprocess-max-iterations": "3",
          "--inprocess-granularity": "rank", "--inprocess-active-world-size": "2",
          "--rerun-mode": "report_stats", "--error-injection-rate": "1000",
          "--error-injection-type": "persistent_error",
          "--result-rejected-tracker-filename": "rejected.txt",
          "--check-weight-hash-across-dp-replicas-interval": "10"}


def _asking_value(flag: str) -> list[str]:
    if REFUSED_ROWS[flag].kwargs.get("action") == "store_true":
        return [flag]
    return [flag, ASKING.get(flag, "7.5")]  # the in-process timeouts: any non-default time


@pytest.mark.parametrize("flag", sorted(REFUSED_ROWS))
def test_refused_runtime_flags_are_one_line_and_neutral_values_pass(flag):
    with pytest.raises(ArgumentValidationError) as err:
        _parse(*_asking_value(flag))
    message = str(err.value)
    assert message.startswith(f"{flag}") and "is not supported" in message
    assert "\n" not in message
    for neutral in REFUSED_ROWS[flag].neutral_values():  # Megatron-LM's default, given
        _parse(flag, str(neutral))


def test_rerun_mode_disabled_passes():
    """It re-runs nothing, which is what happens here (a NaN stops the run)."""
    _parse("--rerun-mode", "disabled")


def test_in_process_active_world_size_of_the_whole_job_passes():
    """Megatron-LM's default for it is $WORLD_SIZE (no warm reserve): that value asks for
    nothing (a megatron-wrap view lists it)."""
    _parse("--inprocess-active-world-size", "2", world=2)


def test_entry_point_applies_the_logging_level_and_keeps_the_iteration_lines():
    """pretrain_gpt.py --logging-level 30: Megatron-LM's line saying so, and the iteration
    line (a print in Megatron-LM) still there."""
    env = {"WORLD_SIZE": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY_GPT_ARGS, "--train-iters", "1",
         "--logging-level", "30"], capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
        cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Setting logging level to 30") == 1, proc.stdout  # once
    assert "iteration        1/       1 |" in proc.stdout, proc.stdout


def test_recipe_refusal_is_one_line_and_exit_code_2():
    """pretrain_gpt.py with a straggler recipe's flags: one line on stderr, exit code 2."""
    env = {"WORLD_SIZE": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY_GPT_ARGS, "--train-iters", "1",
         "--manual-gc", "--log-straggler", "--disable-straggler-on-startup"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("pretrain_gpt.py: error: --log-straggler is not supported")


# --- the facade --------------------------------------------------------------------------

FACADE_CONFIG = {"model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                           "seq_length": 32, "vocab_size": 64, "make_vocab_size_divisible_by": 32},
                 "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": 2,
                              "lr": 1e-3, "seed": 3, "eval_iters": 0},
                 "data": {"tokenizer_type": "NullTokenizer"},
                 "logging": {"metric_writers": [], "progress_bar": False}}


# One process for every config, one after the other (a process start is most of the cost):
# each MegatronWrap joins its own group in initialize() and leaves none behind at its exit.
FACADE_OUTCOME = "facade outcome:"  # marks the script's own lines among the facade's logs
FACADE_SCRIPT = f"""
import json, sys
import torch
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.wrap import MegatronWrap

for config in json.loads(sys.argv[1]):
    assert not torch.distributed.is_initialized()
    with MegatronWrap(config) as wrap:
        try:
            wrap.initialize()
            outcome = [torch.distributed.get_backend(), wrap.run.parallel.distributed_backend]
        except ArgumentValidationError as err:
            outcome = str(err)
    print({FACADE_OUTCOME!r}, json.dumps(outcome), flush=True)
"""


def _facade_outcomes(*backends: str) -> list:
    """MegatronWrap.initialize() in a fresh process (the facade joins its own group) with
    each of ``backends`` in its config, in turn: [group's backend, run's], or the one-line
    refusal, for each."""
    configs = [{**FACADE_CONFIG, "training": {**FACADE_CONFIG["training"],
                                              "distributed_backend": backend}}
               for backend in backends]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", FACADE_SCRIPT, json.dumps(configs)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line[len(FACADE_OUTCOME):]) for line in proc.stdout.splitlines()
            if line.startswith(FACADE_OUTCOME)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="nccl is refused on CPU only")
def test_facade_takes_the_backend_and_refuses_nccl_on_cpu_in_one_line():
    """The facade joins before it checks its flags: nccl on CPU must still end in the flag's
    one line, not in init_process_group's traceback. nccl first: its join is the process's
    first, as in a script; gloo's then joins after the refused run left no group behind."""
    refusal, joined = _facade_outcomes("nccl", "gloo")
    assert refusal.startswith("--distributed-backend nccl needs CUDA devices"), refusal
    assert joined == ["gloo", "gloo"]


def test_a_join_before_the_flag_check_uses_gloo_on_cpu(monkeypatch):
    from megatron.varlen.platform import cpu_device

    monkeypatch.setattr(cpu_device, "use_cpu", lambda: True)
    assert process_settings.joinable_backend("nccl") is None  # the device's: gloo
    monkeypatch.setattr(cpu_device, "use_cpu", lambda: False)
    assert process_settings.joinable_backend("gloo") == "gloo"
