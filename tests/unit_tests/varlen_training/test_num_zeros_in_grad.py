"""``--log-num-zeros-in-grad`` (Megatron-LM's flag): each iteration reports the zero entries of
its gradients, as megatron-core's optimizer counts them between clipping and the update.

Reference: the zeros counted here directly in every parameter's main gradient (DDP's reduced
buffer, what the optimizer steps on) on a DP2 run, and the same count from a run with the
distributed optimizer on the first step (each rank then counts its shard; megatron-core sums
them over the world). Without the flag nothing is counted and the record has no such key.
"""

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

WORLD = 2
STEPS = 2
# Untied: the input embedding rows of tokens a step does not read get exact zero gradients
# (the output layer's rows all get some through the softmax).
ARGS = TINY_GPT_ARGS + ["--train-iters", str(STEPS), "--global-batch-size", "4",
                        "--untie-embeddings-and-output-weights"]


def _zeros_in_main_grads(model) -> int:
    return sum(int((param.main_grad == 0).sum()) for chunk in model
               for param in chunk.parameters() if param.requires_grad)


def rank_counts(argv: list[str]) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        reported, direct, records = [], [], []
        for iteration in range(STEPS):
            report = trainer.step(provider.step_batches(iteration))
            reported.append(report.metrics.num_zeros_in_grad)
            records.append(trainer.record(report))
            direct.append(_zeros_in_main_grads(state.model))
        return {"reported": reported, "direct": direct, "records": records}


def _runs():
    def run(*extra):
        return run_distributed(rank_counts, WORLD, args=(ARGS + list(extra),), timeout_s=240)
    return (run("--log-num-zeros-in-grad"),
            run("--log-num-zeros-in-grad", "--use-distributed-optimizer"), run())


def test_zero_counts_are_the_gradients_zeros_on_every_optimizer_layout():
    plain, distributed, without = _runs()
    for rank in plain:
        assert rank["reported"] == rank["direct"], rank  # DP replicas: each holds all grads
        assert all(count > 0 for count in rank["reported"])  # unread tokens' rows
        assert all(record["num_zeros_in_grad"] == count
                   for record, count in zip(rank["records"], rank["reported"]))
    # The first step's gradients are the same on both layouts (the same initial weights); after
    # an update they may differ in rounding, and a value that rounds to exactly 0 with it.
    assert [rank["reported"][0] for rank in distributed] == [plain[0]["reported"][0]] * WORLD
    for rank in without:
        assert rank["reported"] == [None] * STEPS
        assert all("num_zeros_in_grad" not in record for record in rank["records"])


def test_the_line_and_the_scalars_carry_megatron_lms_names():
    from megatron.varlen_training.iteration_metrics import format_log_line
    from megatron.varlen_training.metric_writers import megatron_lm_scalars

    record = {"iteration": 3, "consumed_samples": 12, "step_time_s": 0.5,
              "tflops_per_device": 1.0, "tokens_per_s": 10.0, "lr": 1e-3,
              "global_batch_size": 4, "lm_loss": 2.0, "loss_scale": 1.0, "grad_norm": 0.5,
              "num_zeros_in_grad": 321, "num_microbatches": 2}
    line = format_log_line(record, 10)
    assert "| grad norm: 0.500 | num zeros: 321 | number of skipped iterations:" in line, line
    assert megatron_lm_scalars(record)["num-zeros"] == 321
