"""--packing-unit document through the whole training path: every token of every document of
the split trains exactly once per epoch, counted in the run's own metrics (sum L and sum L^2 of
the sequences it scheduled) against the corpus's document lengths; on one dataset, and on a
blend of two whose weights make every global batch one epoch of each (one launch, two runs;
the blend's sample table saved under --data-cache-path by rank 0 and memory-mapped by all)."""

from __future__ import annotations

import json

import numpy as np
from megatron.core.datasets import helpers_cpp
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_each_on_this_rank

VOCAB = 128
EOD = VOCAB - 1
BUDGET, DP_CP = 16, 4
LONGEST = BUDGET * DP_CP  # the largest dynamic CP group holds 64 tokens: longer documents are cut
# ids per document (eod included): short, one id (nothing to train), exactly the limit, and
# longer than it (cut into pieces).
DOC_IDS = [2, 5, 1, 17, 40, LONGEST + 1, LONGEST + 2, 130, 9, 3, 66, 24, 11]
# The blend's second dataset (one document cut in two).
OTHER_DOC_IDS = [3, 70, 8, 20, 33, 12, 50]


def _pieces(num_ids: int) -> list[int]:
    tokens = num_ids - 1
    return [min(LONGEST, tokens - start) for start in range(0, tokens, LONGEST)]


def _all_pieces(doc_ids: list[int]) -> list[int]:
    return [n for ids in doc_ids for n in _pieces(ids)]


PIECES, OTHER_PIECES = _all_pieces(DOC_IDS), _all_pieces(OTHER_DOC_IDS)
TOKENS, OTHER_TOKENS = sum(PIECES), sum(OTHER_PIECES)


def _write(prefix: str, doc_ids: list[int], seed: int) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for num_ids in doc_ids:
        builder.add_document(np.append(rng.integers(0, EOD, num_ids - 1), EOD), [num_ids])
    builder.finalize(prefix + ".idx")


def _argv(data_path: list[str], global_batch: int, metrics) -> list[str]:
    return [
        "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--global-batch-size", str(global_batch), "--train-iters", "2", "--lr", "1e-3",
        "--data-path", *data_path, "--split", "100,0,0", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "32",
        "--log-interval", "1", "--eval-iters", "0", "--seed", "3",
        "--dynamic-context-parallel", "--context-parallel-size", "2",
        "--max-seqlen-per-dp-cp-rank", str(BUDGET), "--packing-unit", "document",
        "--log-metrics-jsonl", str(metrics),
    ]


def _blend_batches_are_whole_epochs(global_batch: int) -> bool:
    """The weights are the datasets' training tokens, so the per-sample weights (w_d / mean
    piece) are their pieces: megatron-core's blending then gives each global batch exactly one
    epoch of each dataset (checked with its own function, fed the pieces by hand)."""
    weights = np.array([len(PIECES), len(OTHER_PIECES)], dtype=np.float64)
    dataset_index = np.zeros(2 * global_batch, dtype=np.int16)
    helpers_cpp.build_blending_indices(dataset_index, np.zeros(2 * global_batch, np.int64),
                                       weights / weights.sum(), 2, 2 * global_batch, False)
    return all(np.count_nonzero(batch == 0) == len(PIECES)
               for batch in dataset_index.reshape(2, global_batch))


def test_every_token_trains_once_per_epoch(tmp_path):
    # one global batch per epoch, split over 2 DP replicas
    blend_batch = len(PIECES) + len(OTHER_PIECES)
    assert len(PIECES) % 2 == 0 and blend_batch % 2 == 0
    assert _blend_batches_are_whole_epochs(blend_batch)
    prefix, other = str(tmp_path / "docs_text_document"), str(tmp_path / "other_text_document")
    _write(prefix, DOC_IDS, seed=0)
    _write(other, OTHER_DOC_IDS, seed=1)
    runs = {"one": (_argv([prefix], len(PIECES), tmp_path / "one.jsonl"), PIECES),
            "blend": (_argv([str(TOKENS), prefix, str(OTHER_TOKENS), other], blend_batch,
                            tmp_path / "blend.jsonl")
                      + ["--data-cache-path", str(tmp_path / "cache")], PIECES + OTHER_PIECES)}
    run_distributed(train_each_on_this_rank, DP_CP,
                    args=({name: argv for name, (argv, _) in runs.items()},), timeout_s=300)
    for name, (argv, pieces) in runs.items():
        metrics = tmp_path / f"{name}.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert len(records) == 2, name  # two epochs, one global batch each
        for record in records:
            assert record["seqlen_sum"] == sum(pieces), name
            assert record["seqlen_squared_sum"] == sum(n * n for n in pieces), name
            assert record["consumed_samples"] % len(pieces) == 0, name
    assert len(list((tmp_path / "cache").glob("*-WholeDocumentBlend-train-*.npy"))) == 2
