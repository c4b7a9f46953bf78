"""pretrain_gpt.py on indexed data: the same sample stream on every layout, packed or not, and
after a resume.

Each rank records which samples of the indexed dataset it trained on (the ``sample_id`` of every
sample its reader returned, whether read in the rank or by --num-workers worker processes); the
reads of the DP replicas must partition the global batches of the run:
sample ``iteration x global batch + k``, every one read by exactly one replica. The losses then
agree within float32 rounding (1 rank unpacked and without workers; DP2 unpacked, DP2 packed and
dynamic CP on 4 ranks with Megatron-LM's default of 2 workers), and a run stopped
after 4 of 8 iterations and resumed gives the 8 losses of the straight run, bit for bit.
"""

from __future__ import annotations

import pytest
from megatron.core import parallel_state

from megatron.varlen_training.datasets.sample_reader import SampleReader
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

RTOL = 1e-5
ITERS, GLOBAL_BATCH = 5, 8
COMMON = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "32", "--global-batch-size", str(GLOBAL_BATCH), "--lr", "2e-3",
    "--tokenizer-type", "ByteLevelTokenizer", "--make-vocab-size-divisible-by", "32",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--position-embedding-type", "rope",
    "--log-interval", "1", "--eval-iters", "0", "--seed", "5", "--split", "90,10,0",
    "--calculate-per-token-loss",
]
UNPACKED = ["--micro-batch-size", "2"]
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]
LAYOUTS = {  # name: (flags, ranks)
    "dp2_unpacked": (UNPACKED, 2),
    "dp2_packed": (PACKED, 2),
    # every 32-token sample needs a CP group of 2 under a 16-token budget, on 4 DP x CP ranks
    "dynamic_cp_4_ranks": (["--micro-batch-size", "1", "--dynamic-context-parallel",
                            "--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank",
                            "16"], 4),
}


def train_recording_reads(argv: list[str]) -> dict:
    """train_on_this_rank, plus the (DP rank, sample id) of every sample read for training."""
    reads, original = [], SampleReader.read

    def recording(self, iteration):
        samples = original(self, iteration)
        reads.extend((parallel_state.get_data_parallel_rank(), s["sample_id"]) for s in samples)
        return samples

    SampleReader.read = recording
    try:
        result = train_on_this_rank(argv)
    finally:
        SampleReader.read = original
    return {**result, "reads": reads}


def _run(argv, world):
    results = run_distributed(train_recording_reads, world, args=(argv,), timeout_s=300)
    return [h["lm_loss"] for h in loss_owner_history(results)], results


def _assert_replicas_partition_the_batches(results, num_samples):
    """Every sample of the run read by exactly one DP replica (its TP/CP ranks may repeat it)."""
    by_replica: dict[int, set[int]] = {}
    for result in results:
        for dp_rank, idx in result["reads"]:
            by_replica.setdefault(dp_rank, set()).add(idx)
    union = set().union(*by_replica.values())
    assert union == set(range(num_samples)), sorted(set(range(num_samples)) ^ union)
    assert sum(map(len, by_replica.values())) == num_samples, "a sample read by two replicas"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("indexed")
    write_corpus(str(folder / "docs"), 150, seed=3)
    return ["--data-path", str(folder / "docs"), "--data-cache-path", str(folder / "cache")]


@pytest.fixture(scope="module")
def single_rank(corpus):
    return _run(COMMON + corpus + UNPACKED + ["--train-iters", str(ITERS), "--num-workers", "0"],
                1)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_reads_the_same_stream(corpus, single_rank, layout):
    reference, reference_results = single_rank
    _assert_replicas_partition_the_batches(reference_results, ITERS * GLOBAL_BATCH)
    extra, world = LAYOUTS[layout]
    losses, results = _run(COMMON + corpus + extra + ["--train-iters", str(ITERS)], world)
    _assert_replicas_partition_the_batches(results, ITERS * GLOBAL_BATCH)
    assert len(losses) == ITERS
    for it, (got, ref) in enumerate(zip(losses, reference), start=1):
        assert abs(got - ref) <= RTOL * abs(ref), f"{layout} iteration {it}: {got} vs {ref}"


def test_resume_mid_epoch_continues_the_stream(corpus, tmp_path):
    run = COMMON + corpus + PACKED + ["--train-iters", "8", "--lr-warmup-iters", "1"]
    straight, _ = _run(run, 2)
    first, first_results = _run(run + ["--save", str(tmp_path), "--exit-interval", "4"], 2)
    resumed, resumed_results = _run(run + ["--load", str(tmp_path)], 2)
    assert len(first) == 4 and len(resumed) == 4
    assert first + resumed == straight
    assert {idx for r in first_results for _, idx in r["reads"]} == set(range(4 * GLOBAL_BATCH))
    assert {idx for r in resumed_results for _, idx in r["reads"]} == \
        set(range(4 * GLOBAL_BATCH, 8 * GLOBAL_BATCH))
