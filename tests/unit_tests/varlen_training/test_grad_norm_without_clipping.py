"""``--clip-grad 0`` (no clipping) still reports the grad norm, as Megatron-LM does.

Fact (megatron-core 0.16.1 and Megatron-LM main, read): ``get_megatron_optimizer`` returns a
``ChainedOptimizer``, whose ``step`` computes ``get_grad_norm()`` first and clips each inner
optimizer only where its ``clip_grad > 0``; Megatron-LM's ``train_step`` hands that norm to
``training_log``, which prints ``grad norm:`` whenever it is not None. So the line, the record
and ``grad-norm`` carry the gradients' norm before (and without) clipping.

Reference: the float64 norm of every parameter's gradient (the main grads the optimizer stepped
on, one rank, each parameter once), read after the step: unclipped with ``--clip-grad 0`` they
still have the reported norm; with a clip below it they were scaled to the clip, while the
reported norm stays the pre-clip one.
"""

import math

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

CLIP = 1e-3  # far below the tiny model's first grad norms (about 0.5)


def _grad_norm(model) -> float:
    return math.sqrt(sum(float(param.main_grad.double().square().sum())
                         for chunk in model for param in chunk.parameters()))


def _stepped_grad_norm(optimizer) -> float:
    """The norm of the gradients the optimizer stepped on (fp32: its params' ``.grad``, the
    main grads after clipping)."""
    params = [param for inner in getattr(optimizer, "chained_optimizers", [optimizer])
              for param in inner.get_parameters()]
    return math.sqrt(sum(float(param.grad.double().square().sum()) for param in params))


def _train(clip: str) -> dict:
    with stepping_trainer(TINY_GPT_ARGS + ["--train-iters", "2", "--clip-grad", clip]) as (
            trainer, state, provider):
        runs = []
        for iteration in range(2):
            report = trainer.step(provider.step_batches(iteration))
            runs.append({"reported": report.grad_norm, "record": trainer.record(report),
                         "main_grads": _grad_norm(state.model),
                         "stepped": _stepped_grad_norm(state.optimizer)})
        return runs


@pytest.fixture(scope="module")
def runs():
    return {clip: run_distributed(_train, 1, args=(clip,), timeout_s=240)[0]
            for clip in ("0", str(CLIP))}


def test_without_clipping_the_grad_norm_is_still_reported(runs):
    from megatron.varlen_training.iteration_metrics import format_log_line

    for step in runs["0"]:
        assert step["reported"] is not None
        assert step["reported"] == pytest.approx(step["main_grads"], rel=1e-6)
        assert step["stepped"] == pytest.approx(step["reported"], rel=1e-6)  # not clipped
        assert step["record"]["grad_norm"] == step["reported"]
        assert f"| grad norm: {step['reported']:.3f} |" in format_log_line(step["record"], 2)


def test_with_clipping_the_reported_norm_is_the_one_before_it(runs):
    first = runs[str(CLIP)][0]
    assert first["reported"] == pytest.approx(runs["0"][0]["reported"], rel=1e-12)  # same step
    assert first["reported"] > 100 * CLIP
    assert first["stepped"] == pytest.approx(CLIP, rel=1e-4)  # megatron-core scaled the grads
