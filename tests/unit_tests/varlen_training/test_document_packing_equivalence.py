"""Packed documents never change the numbers: with Megatron-LM's ``--reset-position-ids
--reset-attention-mask --eod-mask-loss`` the packed run (``--sequence-packing``: every document
piece of a pretraining sample its own THD sequence) == the unpacked run (a dense per-sample
mask), losses and grad norms of iterations 1-5, within float32 rounding; without the flags a
packed sample stays whole and equals the plain unpacked run.

The data is megatron-core's own ``GPTDataset`` over a tiny .bin/.idx written here with
``IndexedDatasetBuilder``: documents of 1 to 70 ids (eod-terminated) concatenated and cut into
``--seq-length`` samples, so most samples hold several documents and many documents are cut at
a sample boundary. The reference is one unpacked rank; learned absolute positions make the
position reset count (RoPE would hide it: it only sees relative positions). The runs of each
world size share one launch, one trainer after another (a launch costs more than a run).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank

RTOL = 1e-5
NUM_ITERS = 5
SEQ_LENGTH, VOCAB = 64, 128
EOD = VOCAB - 1  # NullTokenizer's eod (and pad)
NO_PAD_ID = -1   # megatron-core's "no pad token": pad == eod must not mask eod labels
COMMON = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", str(SEQ_LENGTH), "--global-batch-size", "8",
    "--train-iters", str(NUM_ITERS), "--lr", "2e-3", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--log-interval", "1", "--eval-iters", "0", "--seed", "11", "--calculate-per-token-loss",
    "--eod-mask-loss",
]
RESETS = ["--reset-position-ids", "--reset-attention-mask"]
UNPACKED = COMMON + RESETS + ["--micro-batch-size", "2", "--attention-backend", "local"]
PACKED = COMMON + RESETS + ["--micro-batch-size", "1", "--sequence-packing"]
LAYOUTS = {
    "dp2": ([], 2),
    "dp2_cp2": (["--context-parallel-size", "2"], 4),
    "dynamic_cp_4_ranks": (["--dynamic-context-parallel", "--context-parallel-size", "2",
                            "--max-seqlen-per-dp-cp-rank", "16"], 4),
    "tp2_dp2": (["--tensor-model-parallel-size", "2"], 4),
    "pp2_dp2": (["--pipeline-model-parallel-size", "2"], 4),
}


def write_corpus(prefix: str, num_docs: int = 120, seed: int = 0) -> None:
    """Documents of 1..70 ids, each ending in eod, as megatron-core's indexed dataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for length in rng.integers(0, 70, num_docs):
        builder.add_document(np.append(rng.integers(0, EOD, length), EOD), [length + 1])
    builder.finalize(prefix + ".idx")


class _CoreTokenizer:
    eod, pad, vocab_size = EOD, NO_PAD_ID, VOCAB
    unique_identifiers = {"class": "test", "eod": EOD}


class GPTDatasetSamples(torch.utils.data.Dataset):
    """megatron-core's GPTDataset (flags off: the fork applies them) as the fork's samples."""

    def __init__(self, prefix: str, num_samples: int, seed: int):
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split

        config = GPTDatasetConfig(
            random_seed=seed, sequence_length=SEQ_LENGTH, split="1,0,0",
            tokenizer=_CoreTokenizer(), reset_position_ids=False, reset_attention_mask=False,
            eod_mask_loss=False, create_attention_mask=False, path_to_cache=None)
        indexed = IndexedDataset(prefix)
        self.core = GPTDataset(indexed, prefix, np.arange(len(indexed)), num_samples,
                               Split.train, config)
        self.num_samples = num_samples

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        from megatron.varlen_training.datasets.sample import make_sample

        sample = self.core[idx]
        document = torch.cat([sample["tokens"], sample["labels"][-1:]]).numpy()
        return make_sample(document, None, idx, EOD)


def train_on_corpus(argv: list[str], prefix: str) -> dict:
    """The real training path with the datasets replaced by megatron-core's GPTDataset."""
    import megatron.varlen_training.pretrain as pretrain_module

    def build_split_datasets(run, tokenizer):
        return GPTDatasetSamples(prefix, run.data.train_samples, run.training.seed), None, None

    # The name pretrain.py calls: a stale name here would train every run on mock data alike
    # (test_without_the_flags_packed_samples_stay_whole guards that the corpus is read).
    original = pretrain_module.build_split_datasets
    pretrain_module.build_split_datasets = build_split_datasets
    try:
        return train_on_this_rank(argv)
    finally:  # the next run of the same launch may read --data-path itself
        pretrain_module.build_split_datasets = original


def train_runs(runs: dict[str, tuple[list[str], bool]], prefix: str) -> dict[str, dict]:
    """Each named run in turn on this launch's process group: ``(flags, on_corpus)``, where
    ``on_corpus`` trains on megatron-core's GPTDataset of ``prefix`` (:func:`train_on_corpus`)
    and otherwise the run reads its data itself (``--data-path``)."""
    return {name: train_on_corpus(argv, prefix) if on_corpus else train_on_this_rank(argv)
            for name, (argv, on_corpus) in runs.items()}


# Runs that write --log-metrics-jsonl (test_flops_count_documents_not_samples reads them).
METRICS_RUNS = ("unpacked", "dynamic_cp_4_ranks")
DATA_PATH_WITHOUT_MOCK = [flag for flag in COMMON if flag != "--mock-data"]
UNPACKED_FLAGS = RESETS + ["--micro-batch-size", "2", "--attention-backend", "local"]


def _runs(prefix: str, metrics_dir) -> dict[int, dict[str, tuple[list[str], bool]]]:
    """Every run of this file by world size (each world's runs share one launch)."""
    data = DATA_PATH_WITHOUT_MOCK + ["--data-path", prefix, "--split", "100,0,0"]
    runs = {  # name: (flags, world, on_corpus); --data-path's first: no corpus patch before
        "data_path_reference": (data + UNPACKED_FLAGS, 1, False),
        "data_path_dynamic_cp": (data + RESETS + ["--micro-batch-size", "1",
                                                  "--sequence-packing"]
                                 + LAYOUTS["dynamic_cp_4_ranks"][0], 4, False),
        "unpacked": (UNPACKED, 1, True),
        **{layout: (PACKED + extra, world, True) for layout, (extra, world) in LAYOUTS.items()},
        "unpacked_cp2": (UNPACKED + ["--context-parallel-size", "2"], 2, True),
        "plain": (COMMON + ["--micro-batch-size", "2"], 1, True),
        "packed_whole": (COMMON + ["--micro-batch-size", "1", "--sequence-packing"], 2, True),
    }
    by_world: dict[int, dict] = {}
    for name, (argv, world, on_corpus) in runs.items():
        if name in METRICS_RUNS:
            argv = argv + ["--log-metrics-jsonl", str(metrics_dir / f"{name}.jsonl")]
        by_world.setdefault(world, {})[name] = (argv, on_corpus)
    return by_world


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("documents") / "text_document")
    write_corpus(prefix)
    return prefix


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("document_metrics")


@pytest.fixture(scope="module")
def histories(corpus, metrics_dir) -> dict[str, list[tuple[float, float]]]:
    """{run name: (loss, grad norm) of iterations 1-5}, one launch per world size."""
    out = {}
    for world, runs in sorted(_runs(corpus, metrics_dir).items()):
        per_rank = run_distributed(train_runs, world, args=(runs, corpus), timeout_s=300)
        for name in runs:
            history = loss_owner_history([rank[name] for rank in per_rank])
            assert len(history) == NUM_ITERS, name
            out[name] = [(h["lm_loss"], h["grad_norm"]) for h in history]
    return out


@pytest.fixture(scope="module")
def unpacked(histories):
    return histories["unpacked"]


def _assert_close(got, ref, what):
    for it, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(got, ref), start=1):
        assert abs(loss - ref_loss) <= RTOL * abs(ref_loss), (what, it, loss, ref_loss)
        assert abs(norm - ref_norm) <= 10 * RTOL * abs(ref_norm), (what, it, norm, ref_norm)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_documents_match_the_unpacked_reset_mask_run(histories, unpacked, layout):
    _assert_close(histories[layout], unpacked, layout)


def test_dense_mask_is_split_for_context_parallelism(histories, unpacked):
    """The unpacked reference itself on CP2: the mask's query rows follow the tokens' CP split,
    its key columns stay whole (K and V are all-gathered)."""
    _assert_close(histories["unpacked_cp2"], unpacked, "unpacked cp2")


def test_the_samples_hold_several_documents(corpus):
    """Guards the comparison: cuts inside samples are common, not an edge case."""
    from megatron.varlen_training.datasets.documents import document_spans

    samples = GPTDatasetSamples(corpus, 40, seed=11)
    pieces = [len(document_spans(samples[i]["tokens"], SEQ_LENGTH, EOD)) for i in range(40)]
    assert min(pieces) >= 2 and sum(pieces) > 2.5 * 40, pieces


def test_without_the_flags_packed_samples_stay_whole(histories, unpacked):
    """The flags matter (a plain causal run trains something else), and without them packing
    keeps each sample one sequence: packed == the plain unpacked run."""
    plain = histories["plain"]
    assert plain[0][0] != pytest.approx(unpacked[0][0], rel=100 * RTOL)
    _assert_close(histories["packed_whole"], plain, "packed without the flags")


def _document_lengths(corpus: str, iteration: int, global_batch_size: int = 8) -> np.ndarray:
    """Independent of the code under test: cut each sample after every eod with numpy."""
    samples = GPTDatasetSamples(corpus, (iteration + 1) * global_batch_size, seed=11)
    lengths = []
    for idx in range(iteration * global_batch_size, (iteration + 1) * global_batch_size):
        tokens = samples.core[idx]["tokens"].numpy()
        cuts = np.concatenate([[0], np.flatnonzero(tokens == EOD) + 1, [len(tokens)]])
        lengths += [n for n in np.diff(np.unique(cuts)) if n > 0]
    return np.array(lengths, dtype=np.float64)


def test_flops_count_documents_not_samples(corpus, histories, metrics_dir):
    """sum L and sum L^2 (hence model FLOPs) are over documents on both paths, == float64 sums
    over the documents of megatron-core's samples; attention FLOPs per document, not per
    --seq-length sample."""
    import json

    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.flops import num_floating_point_operations

    def records(name):
        assert histories[name], name  # the run behind the file has finished
        path = metrics_dir / f"{name}.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == NUM_ITERS, name
        return lines

    model = parse_run_config(UNPACKED, world_size=1).model
    per_token = float(num_floating_point_operations(model, 1, 0))
    per_square = float(num_floating_point_operations(model, 0, 1))
    for name in METRICS_RUNS:
        for it, record in enumerate(records(name)):
            lengths = _document_lengths(corpus, it)
            assert record["seqlen_sum"] == lengths.sum() == 8 * SEQ_LENGTH
            assert record["seqlen_squared_sum"] == (lengths ** 2).sum() < 8 * SEQ_LENGTH ** 2
            flops = num_floating_point_operations(model, record["seqlen_sum"],
                                                  record["seqlen_squared_sum"])
            expected = per_token * lengths.sum() + per_square * (lengths ** 2).sum()
            assert flops == pytest.approx(expected, rel=1e-12), name


def test_through_data_path(histories):
    """The same comparison through --data-path (the run builds megatron-core's datasets):
    dynamic CP on 4 ranks == one unpacked rank with the three flags."""
    _assert_close(histories["data_path_dynamic_cp"], histories["data_path_reference"],
                  "--data-path")
