"""``--use-distributed-optimizer`` state follows megatron-core's DDP gradient buckets, whose size
follows ``--overlap-grad-reduce`` (with it, buckets of max(40M, 1M x DP) parameters; without
it, one bucket per buffer). On a model above 40M parameters, resuming with the flag toggled
stopped every rank with a torch CheckpointException traceback (a BaseException: "Global shape
mismatch ... bucket_idx_0"); now it is one line naming the flag and --no-load-optim, and
--no-load-optim resumes with the weights.

The bucket size is what matters, not the model's: every run here sets ``--ddp-bucket-size``
below the tiny model's size (about 64k parameters: many buckets with the flag, one without, as
a model above 40M parameters at the default size), so only the flag is toggled. One 1-rank
launch.
"""

import pytest

from megatron.varlen_training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank

LAUNCH_TIMEOUT_S = 300
# --ddp-bucket-size applies with --overlap-grad-reduce only (Megatron-LM's DDP).
ABOVE_ONE_BUCKET = [
    "--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "4",
    "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
    "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "128", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--log-interval", "1", "--eval-iters", "0", "--seed", "7", "--lr-decay-iters", "2",
    "--use-distributed-optimizer", "--ddp-bucket-size", "4000",
]


def _losses_or_refusal(argv: list[str]) -> dict:
    try:
        return {"losses": [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]}
    except CheckpointError as err:
        return {"refusal": str(err)}


def _cases(folder: str) -> dict[str, dict]:
    return {name: _losses_or_refusal(ABOVE_ONE_BUCKET + argv) for name, argv in {
        "save": ["--train-iters", "1", "--save", folder],
        "toggled": ["--train-iters", "2", "--load", folder, "--overlap-grad-reduce"],
        "weights_only": ["--train-iters", "2", "--load", folder, "--overlap-grad-reduce",
                         "--no-load-optim"],
    }.items()}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    folder = str(tmp_path_factory.mktemp("buckets"))
    return run_distributed(_cases, 1, args=(folder,), timeout_s=LAUNCH_TIMEOUT_S)[0]


def test_toggled_overlap_is_one_line(cases):
    refusal = cases["toggled"]["refusal"]
    assert refusal.startswith("--load: the checkpoint's distributed optimizer state does not "
                              "fit this run's gradient buckets (saved bucket 0 holds "), refusal
    assert "--overlap-grad-reduce" in refusal and "--no-load-optim" in refusal
    assert "--ddp-bucket-size" in refusal and "--ddp-num-buckets" in refusal  # also size them
    assert "\n" not in refusal


def test_weights_only_resumes(cases):
    assert len(cases["weights_only"]["losses"]) == 1  # iteration 2, after the loaded 1
