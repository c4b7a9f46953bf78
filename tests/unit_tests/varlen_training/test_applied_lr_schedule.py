"""The learning rate and weight decay each update actually applies, against Megatron-LM.

Reference: megatron-core's own ``OptimizerParamScheduler`` built from the raw flag values the
way Megatron-LM's ``get_optimizer_param_scheduler`` builds it (lengths in samples:
``--lr-decay-iters`` x ``--global-batch-size``, ``--train-iters`` when unset, ...), and stepped
as Megatron-LM's ``train_step`` steps it: by micro-batches x micro-batch size x DP, and only
after an update was applied (a step the fp16 loss scaler skips leaves the schedule alone).
Ours: :func:`training.train_step` driving the scheduler :func:`training.build_scheduler` makes
from the parsed flags. The forward/backward is stubbed out: what is compared is the loop's
bookkeeping, read off the optimizer's param groups when the update runs.
"""

from types import SimpleNamespace

import pytest
import torch
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron.varlen_training import training
from megatron.varlen_training.arguments import parse_args
from megatron.varlen_training.config.from_flags import run_config
from tests.harness.training_runs import TINY_GPT_ARGS

GBS = 4  # TINY_GPT_ARGS' --global-batch-size (micro-batch 2 x DP 1 x 2 micro-batches)
LR, MIN_LR, WEIGHT_DECAY = 1e-3, 1e-4, 0.05


class _ScalerOptimizer:
    """megatron-core's optimizer surface that ``training.optimizer_step`` drives; the fp16 loss
    scaler's verdict per step is scripted (``overflows``). Records the learning rate and weight
    decay of every applied update."""

    def __init__(self, overflows):
        self.param_groups = [{"params": [], "lr": 0.0, "weight_decay": 0.0},
                             {"params": [], "lr": 0.0, "weight_decay": 0.0, "wd_mult": 0.0}]
        # No clipping (nothing to clip here), no zero count.
        self.config = SimpleNamespace(clip_grad=0.0, log_num_zeros_in_grad=False)
        self._overflows = list(overflows)
        self.applied = []  # (lr, weight decay, no-decay group's weight decay) per update

    def zero_grad(self):
        pass

    def prepare_grads(self) -> bool:
        return self._overflows.pop(0)  # True: Inf/NaN in the scaled grads, skip the update

    def get_grad_norm(self) -> float:
        return 1.0

    def step_with_ready_grads(self):
        self.applied.append(tuple(self.param_groups[0][key] for key in ("lr", "weight_decay"))
                            + (self.param_groups[1]["weight_decay"],))


class _Chunk:
    def zero_grad_buffer(self):
        pass


def _megatron_lm_scheduler(optimizer, flags: dict) -> OptimizerParamScheduler:
    """Megatron-LM's get_optimizer_param_scheduler (read as facts from its training.py) on raw
    flag values; nothing taken from our resolution of them."""
    gbs = flags["global_batch_size"]
    wsd_decay_steps = None
    if flags.get("train_iters"):
        decay_iters = flags.get("lr_decay_iters") or flags["train_iters"]
        decay_steps = decay_iters * gbs
        wd_incr_steps = flags["train_iters"] * gbs
        warmup_steps = flags.get("lr_warmup_iters", 0) * gbs
        if flags.get("lr_wsd_decay_iters") is not None:
            wsd_decay_steps = flags["lr_wsd_decay_iters"] * gbs
    else:
        decay_steps = flags.get("lr_decay_samples") or flags["train_samples"]
        wd_incr_steps = flags["train_samples"]
        warmup_steps = flags.get("lr_warmup_samples", 0)
        wsd_decay_steps = flags.get("lr_wsd_decay_samples")
    if flags.get("lr_warmup_fraction") is not None:
        warmup_steps = flags["lr_warmup_fraction"] * decay_steps
    wd_style = flags.get("weight_decay_incr_style", "constant")
    start_wd, end_wd = (WEIGHT_DECAY, WEIGHT_DECAY) if wd_style == "constant" else (
        flags["start_weight_decay"], flags["end_weight_decay"])  # Megatron-LM's validate_args
    return OptimizerParamScheduler(
        optimizer, init_lr=flags.get("lr_warmup_init", 0.0), max_lr=LR,
        min_lr=flags.get("min_lr", 0.0), lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_steps, lr_decay_style=flags.get("lr_decay_style", "linear"),
        start_wd=start_wd, end_wd=end_wd, wd_incr_steps=wd_incr_steps, wd_incr_style=wd_style,
        wsd_decay_steps=wsd_decay_steps,
        lr_wsd_decay_style=flags.get("lr_wsd_decay_style", "exponential"))


def _megatron_lm_applied(flags: dict, overflows: list[bool]) -> list[tuple]:
    """What Megatron-LM applies: the scheduler advances by the step's samples after each
    applied update, never after a skipped one."""
    optimizer = _ScalerOptimizer([])
    scheduler = _megatron_lm_scheduler(optimizer, flags)
    for overflow in overflows:
        if not overflow:
            optimizer.step_with_ready_grads()
            scheduler.step(increment=flags["global_batch_size"])
    return optimizer.applied


def _ours_applied(argv: list[str], overflows: list[bool], monkeypatch) -> list[tuple]:
    run = run_config(parse_args(TINY_GPT_ARGS + ["--weight-decay", str(WEIGHT_DECAY)] + argv,
                                world_size=1))
    optimizer = _ScalerOptimizer(overflows)
    state = training.TrainState(model=[_Chunk()], optimizer=optimizer,
                                scheduler=training.build_scheduler(run, optimizer), config=None)
    monkeypatch.setattr(training, "run_forward_backward", lambda *args, **kwargs: [])
    monkeypatch.setattr(training, "reduce_reported_loss", lambda losses: 2.5)
    grad_norms = [training.train_step(run, state, step=None)[1] for _ in overflows]
    assert [norm is None for norm in grad_norms] == overflows  # a skipped step has no norm
    return optimizer.applied


def _flags(argv: list[str]) -> dict:
    """``argv``'s schedule flags as Megatron-LM's dests (values as typed)."""
    flags = {"global_batch_size": GBS}
    for flag, value in zip(argv[::2], argv[1::2]):
        name = flag.lstrip("-").replace("-", "_")
        flags[name] = value if name.endswith("style") else float(value) if "." in value \
            or "e-" in value else int(value)
    return flags


SCHEDULES = [
    ["--train-iters", "8", "--lr-warmup-iters", "2"],
    ["--train-iters", "8", "--lr-warmup-iters", "2", "--lr-decay-iters", "6", "--min-lr", "1e-4"],
    ["--train-iters", "8", "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.25",
     "--min-lr", "1e-4"],
    ["--train-iters", "8", "--lr-decay-style", "constant", "--lr-warmup-iters", "3"],
    ["--train-iters", "8", "--lr-decay-style", "inverse-square-root", "--lr-warmup-iters", "2",
     "--min-lr", "1e-4"],
    ["--train-samples", "30", "--lr-warmup-samples", "6", "--lr-decay-style", "cosine"],
    ["--train-samples", "30", "--lr-warmup-fraction", "0.1", "--lr-decay-samples", "20",
     "--min-lr", "1e-4"],
    ["--train-iters", "8", "--lr-warmup-iters", "2", "--lr-warmup-init", "2e-4"],
    ["--train-iters", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3",
     "--lr-warmup-iters", "1", "--min-lr", "1e-4"],
    ["--train-iters", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4",
     "--lr-wsd-decay-style", "cosine"],
    ["--train-samples", "30", "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "10",
     "--lr-wsd-decay-style", "minus_sqrt", "--lr-warmup-samples", "4"],
    ["--train-iters", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "5",
     "--lr-wsd-decay-style", "linear", "--lr-decay-iters", "6"],
    ["--train-iters", "6", "--weight-decay-incr-style", "linear", "--start-weight-decay",
     "0.01", "--end-weight-decay", "0.1"],
    ["--train-samples", "26", "--weight-decay-incr-style", "cosine", "--start-weight-decay",
     "0.0", "--end-weight-decay", "0.2"],
]
NO_OVERFLOW = [False] * 7
SOME_SKIPPED = [True, True, False, True, False, False, False]  # fp16: first steps overflow


@pytest.mark.parametrize("overflows", [NO_OVERFLOW, SOME_SKIPPED], ids=["applied", "skipped"])
@pytest.mark.parametrize("argv", SCHEDULES, ids=lambda argv: " ".join(argv[2:]) or argv[0])
def test_each_update_applies_megatron_lms_lr_and_weight_decay(argv, overflows, monkeypatch):
    ours = _ours_applied(argv, overflows, monkeypatch)
    reference = _megatron_lm_applied(_flags(argv), overflows)
    assert len(ours) == overflows.count(False)
    flat = lambda rows: [value for row in rows for value in row]  # noqa: E731
    assert flat(ours) == pytest.approx(flat(reference), rel=1e-12, abs=1e-18)
    assert all(no_decay == 0.0 for _, _, no_decay in ours)  # wd_mult 0 groups stay undecayed
    if overflows is NO_OVERFLOW:  # the curve moves over the 7 updates: a real comparison
        assert len({lr for lr, _, _ in ours} | {wd for _, wd, _ in ours}) > 2, ours


def test_a_skipped_step_keeps_the_lr_of_the_step_it_replaces(monkeypatch):
    """Spelled out for one schedule: linear warm-up over 2 iterations (8 samples); the first
    two steps overflow, so the first applied update still runs at the initial LR 0, the next
    at half the peak (Megatron-LM: skipped iterations do not advance the scheduler)."""
    applied = _ours_applied(["--train-iters", "8", "--lr-warmup-iters", "2"],
                            [True, True, False, False, False], monkeypatch)
    assert [lr for lr, _, _ in applied] == pytest.approx([0.0, LR / 2, LR], abs=1e-18)


# --- resuming: megatron-core's scheduler takes the checkpoint's values by default here, so a
# --- difference must be refused first (Megatron-LM asserts equality without a flag).

def _scheduler_state(argv: list[str]) -> tuple:
    run = run_config(parse_args(TINY_GPT_ARGS + argv, world_size=1))
    scheduler = training.build_scheduler(run, _ScalerOptimizer([]))
    return run, scheduler


@pytest.mark.parametrize("saved, resumed, needle", [
    (["--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay",
      "0.1"], ["--weight-decay-incr-style", "cosine", "--start-weight-decay", "0",
               "--end-weight-decay", "0.1"],
     "--weight-decay-incr-style linear, this run has cosine"),
    (["--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay",
      "0.1"], ["--weight-decay-incr-style", "linear", "--start-weight-decay", "0.05",
               "--end-weight-decay", "0.1"], "--start-weight-decay) 0.0, this run has 0.05"),
    (["--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay",
      "0.1"], ["--weight-decay-incr-style", "linear", "--start-weight-decay", "0",
               "--end-weight-decay", "0.1", "--train-iters", "12", "--lr-decay-iters", "8"],
     "the weight-decay ramp over --train-iters 8, this run has 12"),
])
def test_a_resume_with_another_weight_decay_ramp_is_refused(saved, resumed, needle):
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.schedule_check import check_scheduler

    _, before = _scheduler_state(["--train-iters", "8"] + saved)
    run, after = _scheduler_state((["--train-iters", "8"] if "--train-iters" not in resumed
                                   else []) + resumed)
    with pytest.raises(CheckpointError) as err:
        check_scheduler(before.state_dict(), after, run)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_longer_run_with_constant_weight_decay_resumes():
    """--train-iters raised on resume (the decay length kept): the constant weight decay's
    ramp length changes, which nothing reads, so it is no reason to refuse."""
    from megatron.varlen_training.resume.schedule_check import check_scheduler

    _, before = _scheduler_state(["--train-iters", "8"])
    run, after = _scheduler_state(["--train-iters", "12", "--lr-decay-iters", "8"])
    check_scheduler(before.state_dict(), after, run)
