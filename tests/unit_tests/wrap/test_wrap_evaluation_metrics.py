"""``MegatronWrap.evaluate`` writes its results through the same metric writers as ``train()``
(TensorBoard and wandb, on the last rank), under the keys ``pretrain_gpt.py``'s evaluations
use (Megatron-LM's ``lm loss validation``, ``... vs samples``, ``... ppl`` with
``log_validation_ppl_to_tensorboard``; a flow metric ``nll`` as ``nll validation``), read back
from the real TensorBoard event files and the offline wandb run (2 gloo ranks, DP2).

References: the values ``evaluate()`` and ``train()`` return, the consumed samples counted
here (global batch x iterations) and ``math.exp`` of the written loss.
"""

import math
import os

import torch

from megatron.wrap import MegatronWrap, MockFlow, register_flow
from megatron.wrap.flows.base import LOSS_KEY
from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import tiny_packed_config
from tests.harness.wandb_offline import offline_history

WORLD, STEPS, GBS = 2, 2, 4
NLL_SCALE = 2.0  # the flow's extra metric is this times the loss: its key cannot be mixed up
FLOAT32_RTOL = 1e-6  # TensorBoard stores float32


@register_flow("test_eval_metrics", replace=True)
class ScaledNLLFlow(MockFlow):
    """The mock flow plus an ``nll`` metric, NLL_SCALE times the loss."""

    metric_names = (LOSS_KEY, "nll")

    def loss(self, output, loss_inputs):
        loss_sum, num_tokens, metrics = super().loss(output, loss_inputs)
        nll = metrics[LOSS_KEY].clone()
        nll[0] *= NLL_SCALE
        return loss_sum, num_tokens, {**metrics, "nll": nll}


def _scalars(folder: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def rank_train_and_evaluate(tmp: str) -> dict:
    os.environ["WANDB_MODE"] = "offline"  # no network: wandb keeps the run on disk
    config = tiny_packed_config(global_batch_size=GBS, train_iters=STEPS)
    config["flow"] = {"flow_name": "test_eval_metrics"}
    config["logging"] = {"metric_writers": ["tensorboard", "wandb"], "progress_bar": False,
                         "tensorboard_dir": f"{tmp}/tb", "wandb_project": "varlen",
                         "wandb_save_dir": f"{tmp}/wandb", "wandb_mode": "offline",
                         "log_validation_ppl_to_tensorboard": True}
    trained, evaluated = [], []
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        held_out = wrap.flow.make_batch(STEPS - 1)
        for step in range(STEPS):
            trained.append(wrap.train(wrap.flow.make_batch(step)))
            wrap.log_last_metrics()
            evaluated.append(wrap.evaluate(held_out))
        writers = len(wrap.trainer.writers)
    if torch.distributed.get_rank() != WORLD - 1:
        return {"writers": writers}
    return {"trained": trained, "evaluated": evaluated, "scalars": _scalars(f"{tmp}/tb"),
            "wandb": offline_history(f"{tmp}/wandb")}


def _close(got: float, expected: float) -> bool:
    return abs(got - expected) <= FLOAT32_RTOL * max(1.0, abs(expected))


@needs_extra("metrics")
def test_evaluate_writes_tensorboard_and_wandb_as_train_does(tmp_path):
    results = run_distributed(rank_train_and_evaluate, WORLD, args=(str(tmp_path),),
                              timeout_s=300)
    assert results[0] == {"writers": 0}  # only the last rank writes
    last = results[-1]
    scalars, rows = last["scalars"], last["wandb"]
    iterations = list(range(1, STEPS + 1))
    losses = [result["loss"] for result in last["evaluated"]]
    assert len(set(losses)) == STEPS  # the model moved between the evaluations
    consumed = [GBS * it for it in iterations]  # counted: one global batch per iteration
    expected = {
        "lm loss validation": (iterations, losses),
        "lm loss validation vs samples": (consumed, losses),
        "nll validation": (iterations, [NLL_SCALE * loss for loss in losses]),
        "nll validation vs samples": (consumed, [NLL_SCALE * loss for loss in losses]),
    }
    for key, (steps, values) in expected.items():
        assert [step for step, _ in scalars[key]] == steps, (key, scalars[key])
        assert all(_close(got, want) for (_, got), want in zip(scalars[key], values)), key
    for suffix in ("", " vs samples"):  # Megatron-LM's perplexity: exp of the written loss
        written = scalars[f"lm loss validation{suffix}"]
        ppl = scalars[f"lm loss validation ppl{suffix}"]
        assert [s for s, _ in ppl] == [s for s, _ in written]
        assert all(_close(p, math.exp(loss)) for (_, p), (_, loss) in zip(ppl, written))
    # train()'s metrics are still there, at the same iterations.
    assert [step for step, _ in scalars["lm_loss"]] == iterations
    for it, trained, evaluated in zip(iterations, last["trained"], last["evaluated"]):
        row = rows[it]  # wandb: one row per iteration, training and evaluation together
        assert _close(row["lm_loss"], trained["loss"]), row
        assert _close(row["lm loss validation"], evaluated["loss"]), row
        assert _close(row["nll validation"], evaluated["nll"]), row
        assert "lm loss validation ppl" not in row  # Megatron-LM writes ppl to TensorBoard only
