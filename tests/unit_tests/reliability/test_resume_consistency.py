"""Issue 10, observations 2, 3 and 6: a resume continues the saved run exactly (dropout
included), applies a changed schedule only when told which side wins, and refuses a layout
change that would change the model."""

import json

import pytest

from megatron.training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank


def _run(argv, world=1):
    return loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                              timeout_s=240))


def _refusal(argv):
    try:
        train_on_this_rank(argv)
    except CheckpointError as err:
        return str(err)
    return None


def _refusals(argv, world=1):
    return run_distributed(_refusal, world, args=(argv,), timeout_s=240)


def _lrs(path):
    return [json.loads(line)["lr"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def four_iters(tmp_path_factory):
    """4 iterations of a 4-iteration schedule (--lr-decay-iters defaults to --train-iters)."""
    root = tmp_path_factory.mktemp("four")
    _run(TINY_GPT_ARGS + ["--train-iters", "4", "--save", str(root)])
    return root


def test_longer_schedule_on_resume_is_refused(four_iters):
    messages = _refusals(TINY_GPT_ARGS + ["--train-iters", "8", "--load", str(four_iters)])
    assert messages == [
        "--load: the checkpoint's schedule has --lr-decay-iters (default --train-iters) 4, "
        "this run has 8; pass --override-opt_param-scheduler to use this run's value or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's"]


def test_other_lr_on_resume_is_refused(four_iters):
    message = _refusals(TINY_GPT_ARGS + ["--train-iters", "4", "--lr", "2e-3", "--load",
                                         str(four_iters)])[0]
    assert message.startswith("--load: the checkpoint's schedule has --lr 0.001, this run "
                              "has 0.002;"), message


def test_override_follows_this_runs_schedule(four_iters, tmp_path):
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    _run(TINY_GPT_ARGS + ["--train-iters", "8", "--log-metrics-jsonl", str(straight)])
    _run(TINY_GPT_ARGS + ["--train-iters", "8", "--load", str(four_iters),
                          "--override-opt_param-scheduler", "--log-metrics-jsonl", str(resumed)])
    assert _lrs(resumed) == _lrs(straight)[4:] and _lrs(resumed)[0] > 0


def test_use_checkpoint_keeps_the_saved_schedule(four_iters, tmp_path):
    resumed = tmp_path / "resumed.jsonl"
    _run(TINY_GPT_ARGS + ["--train-iters", "6", "--load", str(four_iters),
                          "--use-checkpoint-opt_param-scheduler", "--log-metrics-jsonl",
                          str(resumed)])
    assert _lrs(resumed) == [0.0, 0.0]  # the 4-iteration decay had ended


def test_padded_vocab_change_is_refused(tmp_path):
    args = TINY_GPT_ARGS + ["--vocab-size", "130", "--lr-decay-iters", "4"]
    _run(args + ["--train-iters", "2", "--save", str(tmp_path)])
    messages = _refusals(args + ["--train-iters", "3", "--load", str(tmp_path),
                                 "--tensor-model-parallel-size", "2"], world=2)
    assert messages[0] == messages[1] == (
        "--load: the checkpoint's padded vocabulary is 160 (vocab 130 padded to "
        "--make-vocab-size-divisible-by 32 x TP 1), this run's is 192 (vocab 130 padded to "
        "--make-vocab-size-divisible-by 32 x TP 2): that would change the model; choose "
        "--make-vocab-size-divisible-by so that both give the same size")


def test_layout_change_that_keeps_the_model_still_resumes(tmp_path):
    args = TINY_GPT_ARGS + ["--lr-decay-iters", "4"]
    straight = _run(args + ["--train-iters", "3"])
    first = _run(args + ["--train-iters", "2", "--save", str(tmp_path)])
    resumed = _run(args + ["--train-iters", "3", "--load", str(tmp_path),
                           "--tensor-model-parallel-size", "2"], world=2)
    assert [h["lm_loss"] for h in first] == [h["lm_loss"] for h in straight[:2]]
    assert resumed[0]["lm_loss"] == pytest.approx(straight[2]["lm_loss"], rel=1e-5)


def _without(argv, flags):
    """``argv`` without ``flags`` and their values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


def test_resume_with_dropout_is_bit_exact(tmp_path):
    """Default dropout (0.1) on TP2: each TP rank's tracked RNG stream must be restored."""
    args = _without(TINY_GPT_ARGS, {"--hidden-dropout", "--attention-dropout"})
    args += ["--lr-decay-iters", "8", "--tensor-model-parallel-size", "2"]
    straight = _run(args + ["--train-iters", "8"], world=2)
    first = _run(args + ["--train-iters", "4", "--save", str(tmp_path)], world=2)
    resumed = _run(args + ["--train-iters", "8", "--load", str(tmp_path)], world=2)
    got = [h["lm_loss"] for h in first + resumed]
    want = [h["lm_loss"] for h in straight]
    assert got == want, f"resumed {got} != straight {want}"
