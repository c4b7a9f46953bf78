"""--packing-unit document through the whole training path: every token of every document of
the split trains exactly once per epoch, counted in the run's own metrics (sum L and sum L^2 of
the sequences it scheduled) against the corpus's document lengths."""

from __future__ import annotations

import json

import numpy as np
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank

VOCAB = 128
EOD = VOCAB - 1
BUDGET, DP_CP = 16, 4
LONGEST = BUDGET * DP_CP  # the largest dynamic CP group holds 64 tokens: longer documents are cut
# ids per document (eod included): short, one id (nothing to train), exactly the limit, and
# longer than it (cut into pieces).
DOC_IDS = [2, 5, 1, 17, 40, LONGEST + 1, LONGEST + 2, 130, 9, 3, 66, 24, 11]


def _pieces(num_ids: int) -> list[int]:
    tokens = num_ids - 1
    return [min(LONGEST, tokens - start) for start in range(0, tokens, LONGEST)]


PIECES = [n for ids in DOC_IDS for n in _pieces(ids)]


def _write(prefix: str) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for num_ids in DOC_IDS:
        builder.add_document(np.append(rng.integers(0, EOD, num_ids - 1), EOD), [num_ids])
    builder.finalize(prefix + ".idx")


def test_every_token_trains_once_per_epoch(tmp_path):
    assert len(PIECES) % 2 == 0  # one global batch per epoch, split over 2 DP replicas
    prefix = str(tmp_path / "docs_text_document")
    _write(prefix)
    metrics = tmp_path / "metrics.jsonl"
    argv = [
        "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--global-batch-size", str(len(PIECES)), "--train-iters", "2", "--lr", "1e-3",
        "--data-path", prefix, "--split", "100,0,0", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "32",
        "--log-interval", "1", "--eval-iters", "0", "--seed", "3",
        "--dynamic-context-parallel", "--context-parallel-size", "2",
        "--max-seqlen-per-dp-cp-rank", str(BUDGET), "--packing-unit", "document",
        "--log-metrics-jsonl", str(metrics),
    ]
    run_distributed(train_on_this_rank, DP_CP, args=(argv,), timeout_s=300)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(records) == 2  # two epochs, one global batch each
    trainable = sum(ids - 1 for ids in DOC_IDS)
    for record in records:
        assert record["seqlen_sum"] == trainable
        assert record["seqlen_squared_sum"] == sum(n * n for n in PIECES)
        assert record["consumed_samples"] % len(PIECES) == 0

