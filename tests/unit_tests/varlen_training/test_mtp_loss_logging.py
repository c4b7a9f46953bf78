"""Multi-token prediction losses in the log: Megatron-LM's ``mtp_1 loss``, ``mtp_2 loss`` beside
``lm loss`` (its MTPLossLoggingHelper's names), per MTP loss token of the global batch.

Reference: the MTP heads' cross entropy computed here, in float64, from the model's own MTP
logits (captured from its output layer, which megatron-core's ``_postprocess`` calls once per
MTP depth before the main head) and the micro-batch's labels and loss mask: at depth d, position
t predicts ``labels[t + d]`` of its own sample, weighted by ``loss_mask[t + d]``, nothing past
the sample's end. Unpacked mock SFT samples (variable lengths, padded: the loss mask is 0 on
padding). The packed run of the same data, on one rank, split over 2 context-parallel ranks and
on 2 tensor-parallel ranks, must report the same values (packing and CP layout never change
the numbers), and its line and JSONL record carry them by Megatron-LM's names.
"""

import json

import pytest
import torch

from megatron.core.models.gpt import GPTModel
from megatron.varlen_training.errors import NonFiniteLossError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import stepping_trainer, train_on_this_rank

STEPS = 2
DEPTHS = 2
RTOL = 1e-5  # float32 logits and sums against the float64 reference; packed vs unpacked
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 2,
                      "max_seq_len": 32, "mean_seq_len": 12, "lognormal_sigma": 1.0})
ARGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--global-batch-size", "4", "--lr", "2e-3", "--mock-data",
        "--sft", "--sft-mock-dataset-config-json", LENGTHS, "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "128", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--log-interval", "1", "--eval-iters", "0", "--seed", "5",
        "--calculate-per-token-loss", "--train-iters", str(STEPS),
        "--mtp-num-layers", str(DEPTHS)]
UNPACKED = ["--micro-batch-size", "2"]
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]
# On 2 ranks, in one launch: each sequence split over 2 CP ranks (each holds part of every
# depth's tokens: their sums must be added), and TP2 with sequence parallelism (both ranks
# hold the whole loss: it must be counted once).
TWO_RANK_LAYOUTS = {"cp2": ["--context-parallel-size", "2"],
                    "tp2_sp": ["--tensor-model-parallel-size", "2", "--sequence-parallel"]}


# Samples of one token: position 0's MTP target would be the sample's second label, which it
# does not have, so no micro-batch holds an MTP loss token. Unpacked, without per-token loss,
# megatron-core divides each micro-batch's MTP loss by that count.
ONE_TOKEN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "2",
             "--train-iters", "2", "--lr", "2e-3", "--mock-data", "--sft",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
             "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
             "--attention-dropout", "0", "--log-interval", "1", "--eval-iters", "0",
             "--seed", "5"]


def _one_token_runs(lengths_file: str) -> dict[str, list[str]]:
    data = ["--sft-mock-dataset-config-json", json.dumps({"mode": "file", "path": lengths_file})]
    return {"mtp": ONE_TOKEN + data + ["--mtp-num-layers", "1"], "no_mtp": ONE_TOKEN + data}


def _gpt_model(chunk) -> GPTModel:
    return next(module for module in chunk.modules() if isinstance(module, GPTModel))


def _reference(captured) -> list[float]:
    """Each depth's float64 cross entropy per loss token over the step's unpacked micro-batches:
    ``captured`` holds (labels [b, s], loss mask [b, s], MTP logits [s, b, V] per depth)."""
    sums, counts = [0.0] * DEPTHS, [0.0] * DEPTHS
    for labels, loss_mask, depth_logits in captured:
        seq = labels.shape[1]
        for index, logits in enumerate(depth_logits):
            depth = index + 1
            logits = logits.double().transpose(0, 1)[:, : seq - depth]  # [b, s - d, V]
            targets = labels[:, depth:]
            weights = loss_mask[:, depth:].double()
            nll = torch.logsumexp(logits, dim=-1) - logits.gather(
                -1, targets.unsqueeze(-1)).squeeze(-1)
            sums[index] += float((nll * weights).sum())
            counts[index] += float(weights.sum())
    return [loss_sum / count for loss_sum, count in zip(sums, counts)]


def _train(argv: list[str], capture: bool) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        model = _gpt_model(state.model[0])
        step_inputs, outputs = [], []
        hooks = []
        if capture:
            hooks.append(model.register_forward_pre_hook(
                lambda module, args, kwargs: step_inputs.append(
                    (kwargs["labels"].clone(), kwargs["loss_mask"].clone())), with_kwargs=True))
            hooks.append(model.output_layer.register_forward_hook(
                lambda module, args, output: outputs.append(output[0].detach().clone())))
        reported, references, records = [], [], []
        for iteration in range(STEPS):
            step_inputs.clear()
            outputs.clear()
            report = trainer.step(provider.step_batches(iteration))
            reported.append([report.metrics.losses[f"mtp_{d} loss"]
                             for d in range(1, DEPTHS + 1)])
            records.append(trainer.record(report))
            if capture:  # per forward: the MTP depths' logits, then the main head's
                per_forward = [outputs[i * (DEPTHS + 1):(i + 1) * (DEPTHS + 1)][:DEPTHS]
                               for i in range(len(step_inputs))]
                references.append(_reference([(labels, mask, logits) for (labels, mask), logits
                                              in zip(step_inputs, per_forward)]))
        for hook in hooks:
            hook.remove()
        return {"reported": reported, "reference": references, "records": records}


def _train_two_rank_layouts() -> dict:
    return {name: _train(ARGS + PACKED + extra, False)
            for name, extra in TWO_RANK_LAYOUTS.items()}


def _history_or_stop(argv: list[str]) -> dict:
    """One run's history, or the one line it stopped with on a NaN (so that only the test of
    that run fails)."""
    try:
        return {"history": train_on_this_rank(argv)["history"]}
    except NonFiniteLossError as err:
        return {"stopped": str(err)}


def _train_one_rank_runs(one_token_runs: dict[str, list[str]]) -> tuple:
    """The unpacked run (captured for the reference), the packed one and the one-token runs,
    in one process."""
    return (_train(ARGS + UNPACKED, True), _train(ARGS + PACKED, False),
            {name: _history_or_stop(argv) for name, argv in one_token_runs.items()})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    lengths = tmp_path_factory.mktemp("one_token") / "lengths.txt"
    lengths.write_text("1\n")
    (unpacked, packed, one_token), = run_distributed(
        _train_one_rank_runs, 1, args=(_one_token_runs(str(lengths)),), timeout_s=300)
    two_ranks = run_distributed(_train_two_rank_layouts, 2, timeout_s=300)
    return unpacked, packed, two_ranks, one_token


def test_mtp_losses_are_the_heads_cross_entropy(runs):
    unpacked = runs[0]
    for reported, reference in zip(unpacked["reported"], unpacked["reference"]):
        assert reported == pytest.approx(reference, rel=RTOL)
    assert unpacked["reported"][0] != unpacked["reported"][1]  # the weights moved


def test_packing_cp_and_tp_do_not_change_the_mtp_losses(runs):
    unpacked, packed, two_ranks, _ = runs
    for layout, run in [("packed", packed), *((f"{name} rank {rank}", run)
                                               for rank, layouts in enumerate(two_ranks)
                                               for name, run in layouts.items())]:
        for iteration, (ours, reference) in enumerate(zip(run["reported"],
                                                          unpacked["reported"]), start=1):
            assert ours == pytest.approx(reference, rel=RTOL), (layout, iteration)


def test_the_line_and_the_record_carry_megatron_lms_names(runs):
    from megatron.varlen_training.iteration_metrics import format_log_line

    record = runs[1]["records"][0]
    assert record["mtp_1 loss"] == runs[1]["reported"][0][0]
    line = format_log_line(record, STEPS)
    assert f"| lm loss: {record['lm_loss']:.6E} | mtp_1 loss: {record['mtp_1 loss']:.6E} | " \
           f"mtp_2 loss: {record['mtp_2 loss']:.6E} | loss scale: 1.0 |" in line, line


def test_micro_batches_without_mtp_tokens_train_as_without_mtp(runs):
    """Unpacked, without --calculate-per-token-loss, a micro-batch without MTP loss tokens adds
    no MTP loss (megatron-core alone divides 0 by 0: NaN, and the run stops): its MTP layer gets
    no gradient, so the main model trains exactly as the same run without MTP (same weights:
    each parameter is drawn by its name), and the step reports no MTP loss."""
    assert [run.get("stopped") for run in runs[3].values()] == [None, None]
    with_mtp, without = (runs[3][name]["history"] for name in ("mtp", "no_mtp"))
    assert len(with_mtp) == len(without) == 2
    for iteration, (ours, reference) in enumerate(zip(with_mtp, without), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert ours[key] == pytest.approx(reference[key], rel=RTOL), (iteration, key)
        assert "mtp_1 loss" not in ours, iteration  # no MTP token: nothing to report
