"""``--train-iters`` does not change which samples the first iterations train on (mock data and
packed mock SFT; Megatron-LM's GPTDataset on indexed data is megatron-core's own, whose order
depends on the epochs the sample count needs -- a resume across such a change is refused:
test_indexed_resume_checks.py). Measured with --lr 0: the weights stay, so equal losses mean
equal batches, and the next batches give other losses (the comparison can fail)."""

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

SFT = ["--sft", "--sequence-packing", "--micro-batch-size", "1", "--sft-mock-dataset-config-json",
       '{"mode":"distribution","type":"lognormal","min_seq_len":4,"max_seq_len":32,'
       '"mean_seq_len":12,"lognormal_sigma":0.5}']


def rank_losses(runs: list[list[str]]) -> list[list[float]]:
    return [[step["lm_loss"] for step in train_on_this_rank(argv)["history"]] for argv in runs]


def test_a_longer_run_starts_with_the_same_batches():
    base = TINY_GPT_ARGS + ["--lr", "0"]
    runs = [base + data + ["--train-iters", iters] for data in ([], SFT) for iters in ("3", "7")]
    (losses,) = run_distributed(rank_losses, 1, args=(runs,), timeout_s=300)
    for short, long in (losses[:2], losses[2:]):
        assert short == long[:3]
        assert short != long[3:6]  # other batches, other losses
