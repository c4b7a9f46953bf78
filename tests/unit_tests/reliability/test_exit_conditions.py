"""--exit-signal-handler, --exit-interval and --exit-duration-in-mins
stop pretrain_gpt.py after an iteration, on every rank, with a checkpoint that resumes bit for
bit (dropout 0.1 included) and exit code 0.

The SIGTERM case runs pretrain_gpt.py itself on 2 ranks (plain processes, as in
test_fault_injection.py) and signals ONE rank while it trains: the other must stop after the
same iteration. Ranks are reaped whatever happens (each leads its own session, killed at the
end), and every wait has a deadline.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from megatron.varlen_training.errors import INTERRUPTED_EXIT_CODE
from megatron.varlen_training.exit_conditions import SignalCatcher
from megatron.varlen_training import training
from megatron.wrap.config import ConfigError, build_config
from megatron.wrap.runtime import refuse_loop_exit_keys
from tests.harness.multirank import run_distributed
from tests.harness.rendezvous import hosted_store
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank

REPO = Path(__file__).resolve().parents[3]
WORLD = 2
# Iterations take ~20 ms here: the signal, sent once iteration 2 is logged, stops the run a
# few iterations later, well before the straight run's end.
STRAIGHT_ITERS = 30
# The schedule is fixed by --lr-decay-iters, so runs of other lengths (a long run that is
# stopped, a resumed one) follow the same one; mock documents do not depend on the length.
ARGS = [a for i, a in enumerate(TINY_GPT_ARGS)  # default dropout (0.1): RNG states must resume
        if a not in ("--hidden-dropout", "--attention-dropout")
        and TINY_GPT_ARGS[i - 1] not in ("--hidden-dropout", "--attention-dropout")]
ARGS += ["--lr-decay-iters", str(STRAIGHT_ITERS)]
LONG_RUN_ITERS = 1000  # never reached: the signal stops the run long before
SIGNAL_AFTER_ITERATION = 2
LAUNCH_DEADLINE_S = 180.0
EXIT_DEADLINE_S = 60.0
POLL_S = 0.05
STEP_LINE = re.compile(r"INFO  \[[^\]]+\] iteration +(\d+)/")  # after the timestamp


def _losses(argv, world=WORLD) -> list[float]:
    runs = run_distributed(train_on_this_rank, world, args=(argv,), timeout_s=240)
    return [h["lm_loss"] for h in loss_owner_history(runs)]


@pytest.fixture(scope="module")
def straight():
    return _losses(ARGS + ["--train-iters", str(STRAIGHT_ITERS)])


def _resumed(root: Path) -> list[float]:
    return _losses(ARGS + ["--train-iters", str(STRAIGHT_ITERS), "--load", str(root)])


# --- SIGTERM to one rank of a running pretrain_gpt.py ---------------------------------------


@pytest.fixture
def meeting():
    """Where the ranks meet: a store the test hosts (and holds its port), as torchrun does."""
    with hosted_store() as env:
        yield env


def _launch(argv, logs: Path, meeting: dict) -> list[subprocess.Popen]:
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   **meeting, PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # log lines as they happen
        with open(logs / f"rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(REPO / "pretrain_gpt.py"), *argv], env=env, cwd=REPO,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def _wait_for(condition, deadline_s: float, give_up=lambda: False) -> bool:
    """Whether ``condition()`` came true within ``deadline_s`` (False at once on give_up())."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if give_up():
            return condition()
        time.sleep(POLL_S)
    return False


def _reap(procs) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rank and any helper it spawned
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _iterations_logged(path: Path) -> int:
    return max((int(m.group(1)) for m in STEP_LINE.finditer(path.read_text())), default=0)


def test_sigterm_to_one_rank_saves_exits_0_and_resumes_bit_exactly(tmp_path, straight, meeting):
    root, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    argv = ARGS + ["--train-iters", str(LONG_RUN_ITERS), "--exit-signal-handler",
                   "--save", str(root), "--log-metrics-jsonl", str(metrics)]
    procs = _launch(argv, tmp_path, meeting)
    last_log = tmp_path / f"rank{WORLD - 1}.log"  # the last rank prints the iteration lines
    try:
        training_now = _wait_for(
            lambda: _iterations_logged(last_log) >= SIGNAL_AFTER_ITERATION, LAUNCH_DEADLINE_S,
            give_up=lambda: any(p.poll() is not None for p in procs))
        assert training_now, last_log.read_text()[-3000:]
        os.kill(procs[0].pid, signal.SIGTERM)  # rank 0 only: rank 1 learns it from rank 0
        exited = _wait_for(lambda: all(p.poll() is not None for p in procs), EXIT_DEADLINE_S)
    finally:
        _reap(procs)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(WORLD)]
    assert exited, "the ranks did not stop after SIGTERM"
    assert [p.returncode for p in procs] == [0, 0], [log[-2000:] for log in logs]
    assert not any("Traceback" in log for log in logs), [log[-2000:] for log in logs]
    stopped = int((root / TRACKER_FILENAME).read_text())
    assert SIGNAL_AFTER_ITERATION <= stopped < STRAIGHT_ITERS, stopped
    assert (f"exiting after iteration {stopped} of {LONG_RUN_ITERS}: SIGTERM received "
            f"(--exit-signal-handler; a signal on any rank stops every rank); checkpoint "
            f"{root / f'iter_{stopped:07d}'}; resume with --load {root}") in logs[0], logs[0]
    first = [json.loads(line)["lm_loss"] for line in metrics.read_text().splitlines()]
    assert first == straight[:stopped], f"{first} != {straight[:stopped]}"
    resumed = _resumed(root)
    assert resumed == straight[stopped:], f"resumed {resumed} != {straight[stopped:]}"


# --- exit interval, duration, SIGINT (in-process ranks) ------------------------------------


def test_exit_interval_stops_saved_and_resumes_bit_exactly(tmp_path, straight):
    argv = ARGS + ["--train-iters", str(STRAIGHT_ITERS), "--exit-interval", "3",
                   "--save", str(tmp_path), "--save-interval", "2"]
    first = _losses(argv)
    assert first == straight[:3]
    assert (tmp_path / TRACKER_FILENAME).read_text() == "3"
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000002", "iter_0000003"]
    assert _resumed(tmp_path) == straight[3:]


def test_exit_duration_stops_after_the_iteration_that_passes_it(tmp_path):
    # 0.006 s: set-up alone takes longer, so both ranks stop after the first iteration.
    first = _losses(ARGS + ["--train-iters", "4", "--exit-duration-in-mins", "0.0001",
                            "--save", str(tmp_path)])
    assert len(first) == 1
    assert (tmp_path / TRACKER_FILENAME).read_text() == "1"


def _sigint_on_rank_1(argv) -> dict:
    """Rank 1 receives SIGINT while it runs iteration 2; rank 0 receives nothing."""
    import torch

    real_step = training.train_step

    def step_with_sigint(args, state, step, **kwargs):
        if torch.distributed.get_rank() == 1 and state.iteration + 1 == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(args, state, step, **kwargs)

    training.train_step = step_with_sigint
    try:
        return train_on_this_rank(argv)
    finally:
        training.train_step = real_step


def test_sigint_on_one_rank_stops_every_rank_after_that_iteration(tmp_path):
    runs = run_distributed(_sigint_on_rank_1, WORLD, args=(
        ARGS + ["--train-iters", "6", "--exit-signal-handler", "--save", str(tmp_path)],),
        timeout_s=240)
    assert [len(r["history"]) for r in runs] == [2, 2]
    assert (tmp_path / TRACKER_FILENAME).read_text() == "2"


# --- units ----------------------------------------------------------------------------------


def test_second_signal_is_not_swallowed():
    with SignalCatcher((signal.SIGINT,)) as catcher:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(POLL_S)  # Python runs handlers between bytecodes
        assert catcher.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # the previous handler gets the second one
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(POLL_S)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("flag, value, message", [  # ranges: flag_ranges.py, with every flag
    ("--exit-interval", "0", "--exit-interval must be >= 1 (got 0)"),
    ("--exit-interval", "2.5", "argument --exit-interval: invalid int value: '2.5'"),
    ("--exit-duration-in-mins", "-1", "--exit-duration-in-mins must be a finite number > 0 "
                                      "(got -1.0)"),
])
def test_bad_exit_flags_are_one_line(flag, value, message):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "3", flag, value], world_size=1)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_facade_refuses_the_loop_exit_keys():
    """MegatronWrap has no loop of its own: these keys would be ignored, so they are refused."""
    config = build_config({"training": {"exit_interval": 5}})
    with pytest.raises(ConfigError, match=r"^config key 'exit_interval' \(5\) is "
                                          r"pretrain_gpt.py's loop flag and has no effect in "
                                          r"megatron.wrap"):
        refuse_loop_exit_keys(dict(config.flat))
    refuse_loop_exit_keys(dict(build_config({"training": {"exit_signal_handler": False}}).flat))


# --- Ctrl-C without --exit-signal-handler -----------------------------------------------------


def test_ctrl_c_mid_run_is_one_line_exit_130(tmp_path, meeting):
    """Without --exit-signal-handler a Ctrl-C stops the run where it is: one line (no
    KeyboardInterrupt traceback from either rank), exit code 130 on every rank."""
    procs = _launch(ARGS + ["--train-iters", str(LONG_RUN_ITERS)], tmp_path, meeting)
    last_log = tmp_path / f"rank{WORLD - 1}.log"
    try:
        training_now = _wait_for(
            lambda: _iterations_logged(last_log) >= SIGNAL_AFTER_ITERATION, LAUNCH_DEADLINE_S,
            give_up=lambda: any(p.poll() is not None for p in procs))
        assert training_now, last_log.read_text()[-3000:]
        for proc in procs:  # a terminal's Ctrl-C reaches every process of the job
            os.killpg(proc.pid, signal.SIGINT)
        exited = _wait_for(lambda: all(p.poll() is not None for p in procs), EXIT_DEADLINE_S)
    finally:
        _reap(procs)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(WORLD)]
    assert exited, [log[-2000:] for log in logs]
    assert [p.returncode for p in procs] == [INTERRUPTED_EXIT_CODE] * WORLD, \
        [log[-2000:] for log in logs]
    assert not any("Traceback" in log for log in logs), [log[-2000:] for log in logs]
    errors = [line for log in logs for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1 and "interrupted by Ctrl-C (SIGINT) during training" in errors[0], \
        errors
