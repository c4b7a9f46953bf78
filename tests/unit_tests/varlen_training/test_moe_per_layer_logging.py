"""``--moe-per-layer-logging`` (Megatron-LM's MoE flag): each balancing loss also per layer, under
Megatron-LM's ``track_moe_metrics`` names ``moe/<loss>_layer_<i>`` (i from 0 over every layer,
a dense one included with 0), for TensorBoard, wandb and the JSONL, never on the line.

Reference: megatron-core's own tracker. During the test every router of the model also runs
megatron-core's ``TopKRouter.routing`` on the same logits (detached, its output dropped), which
saves each layer's ``seq_aux_loss`` into megatron-core's layer-wise tracker as Megatron-LM
trains; Megatron-LM then logs ``values * 1 / num_microbatches``. Fixed-length mock samples (no
padding) in equal micro-batches on one rank: there the token-weighted per-layer value the fork
reports must equal megatron-core's. The same samples packed report the same per-layer values.
"""

import pytest
import torch

from megatron.core.transformer.moe.moe_utils import (
    clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker,
)
from megatron.core.transformer.moe.router import TopKRouter
from megatron.varlen.model.packed_router import VarlenTopKRouter
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

STEPS = 2
NUM_MICROBATCHES = 2  # global batch 4 in micro-batches of 2 on one rank
LOSS = "seq_load_balancing_loss"
LAYER_FREQ = [1, 0, 1]  # the middle layer dense
ARGS = TINY_GPT_ARGS + [
    "--num-layers", "3", "--moe-layer-freq", str(LAYER_FREQ).replace(" ", ""),
    "--train-iters", str(STEPS), "--num-experts", "4", "--moe-router-topk", "2",
    "--moe-ffn-hidden-size", "16", "--disable-bias-linear",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.1",
    "--moe-per-layer-logging"]
RTOL = 1e-5
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]  # the same samples, packed


def _with_megatron_core_tracking(routing):
    def both(self, logits, padding_mask=None):
        if self.training and torch.is_grad_enabled():  # megatron-core saves only then
            TopKRouter.routing(self, logits.detach().clone(), None)
        return routing(self, logits, padding_mask)
    return both


def _train(argv: list[str], track: bool) -> dict:
    original = VarlenTopKRouter.routing
    if track:
        VarlenTopKRouter.routing = _with_megatron_core_tracking(original)
    try:
        with stepping_trainer(argv) as (trainer, _, provider):
            clear_aux_losses_tracker()
            ours, megatron_core, records = [], [], []
            for iteration in range(STEPS):
                report = trainer.step(provider.step_batches(iteration))
                ours.append(dict(report.metrics.scalars))
                records.append(trainer.record(report))
                if track:
                    values = get_moe_layer_wise_logging_tracker()[LOSS]["values"]
                    megatron_core.append((values / NUM_MICROBATCHES).tolist())
                    clear_aux_losses_tracker()
            return {"ours": ours, "megatron_core": megatron_core, "records": records}
    finally:
        VarlenTopKRouter.routing = original


@pytest.fixture(scope="module")
def runs():
    (tracked,) = run_distributed(_train, 1, args=(ARGS, True), timeout_s=300)
    (plain,) = run_distributed(_train, 1, args=(ARGS[:-1], False), timeout_s=300)
    (packed,) = run_distributed(_train, 1, args=(ARGS + PACKED, False), timeout_s=300)
    return tracked, plain, packed


def test_per_layer_losses_equal_megatron_cores_tracker(runs):
    tracked = runs[0]
    for ours, reference in zip(tracked["ours"], tracked["megatron_core"]):
        names = [f"moe/{LOSS}_layer_{index}" for index in range(len(LAYER_FREQ))]
        assert sorted(ours) == sorted(names)  # every layer, Megatron-LM's names, no other
        assert [ours[name] for name in names] == pytest.approx(reference, rel=RTOL)
        assert reference[1] == 0.0 and reference[0] > 0.0 and reference[2] > 0.0


def test_the_mean_over_moe_layers_is_the_reported_loss_and_not_on_the_line(runs):
    from megatron.varlen_training.iteration_metrics import format_log_line

    tracked, plain, _ = runs
    for record in tracked["records"]:
        moe_layers = [record[f"moe/{LOSS}_layer_{i}"] for i, moe in enumerate(LAYER_FREQ) if moe]
        assert record[LOSS] == pytest.approx(sum(moe_layers) / len(moe_layers), rel=1e-6)
        assert "moe/" not in format_log_line(record, STEPS)
    for record in plain["records"]:  # without the flag: no per-layer key
        assert not any(key.startswith("moe/") for key in record) and LOSS in record


def test_packing_does_not_change_the_per_layer_losses(runs):
    tracked, _, packed = runs
    for iteration, (ours, reference) in enumerate(zip(packed["ours"], tracked["ours"]), 1):
        assert sorted(ours) == sorted(reference)
        for name, value in reference.items():
            assert ours[name] == pytest.approx(value, rel=RTOL, abs=1e-12), (iteration, name)
