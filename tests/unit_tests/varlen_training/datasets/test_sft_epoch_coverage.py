"""Counting: every training sample of an SFT file is read exactly once per epoch across the
data-parallel replicas, unpacked (Megatron's micro-batch slices, ``dp_microbatch_indices``) and
packed (each replica's contiguous block, ``replica_block``), and a run resumed at any iteration
reads what the straight run reads from there on."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from megatron.varlen_training.data import dp_microbatch_indices, global_batch_indices, replica_block
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.tokenizer import ByteLevelTokenizer

NUM_DOCS, SPLIT = 50, "80,20,0"  # 40 training documents: [0, round(0.8 * 50))
NUM_TRAIN = 40


def _train_dataset(tmp_path, num_samples: int):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "response": f"answer {i}"})
                            + "\n" for i in range(NUM_DOCS)))
    run = SimpleNamespace(
        model=SimpleNamespace(seq_length=64, vocab_size=None),
        data=SimpleNamespace(mock_data=False, sft=True, data_path=[str(path)], split=SPLIT,
                             sft_mock_dataset_config_json=None, train_samples=num_samples,
                             eval_samples=0, test_samples=0, sft_messages_key="messages",
                             sft_prompt_key="prompt", sft_response_key="response",
                             indexed=False, full_validation=False),
        training=SimpleNamespace(seed=11),
        parallel=SimpleNamespace(context_parallel_size=1, tensor_model_parallel_size=1,
                                 sequence_parallel=False),
        packing=SimpleNamespace(sequence_packing=True))
    train, _ = build_datasets(run, ByteLevelTokenizer())
    return train


def _prompt_number(sample) -> int:
    """The document a sample came from, read off its text (not through the dataset's ids)."""
    text = bytes(t for t in sample["tokens"].tolist() if t < 256).decode()
    return int(text.split("question ")[1].split("answer")[0])


def _replica_reads(iteration, gbs, mbs, dp, rank, packed):
    indices = global_batch_indices(iteration, gbs)
    if packed:
        return list(replica_block(indices, dp, rank))
    return [k for micro in dp_microbatch_indices(indices, mbs, dp, rank) for k in micro]


@pytest.mark.parametrize("gbs, mbs, dp, packed", [
    (8, 1, 2, False), (8, 2, 2, False), (10, 1, 5, False), (8, 1, 4, True), (12, 1, 3, True),
])
def test_each_document_once_per_epoch_across_replicas(tmp_path, gbs, mbs, dp, packed):
    num_iters = 3 * NUM_TRAIN // gbs  # three whole epochs
    train = _train_dataset(tmp_path, num_iters * gbs)
    reads = [[k for rank in range(dp) for k in _replica_reads(i, gbs, mbs, dp, rank, packed)]
             for i in range(num_iters)]
    flat = [k for step in reads for k in step]
    assert sorted(flat) == list(range(num_iters * gbs)), "a read index repeated or skipped"
    documents = [_prompt_number(train[k]) for k in flat]
    by_position = dict(zip(flat, documents))
    for epoch in range(3):
        seen = Counter(by_position[k] for k in range(epoch * NUM_TRAIN, (epoch + 1) * NUM_TRAIN))
        assert seen == Counter(range(NUM_TRAIN)), f"epoch {epoch}"
    resumed = _train_dataset(tmp_path, num_iters * gbs)  # a fresh process's dataset
    start = num_iters // 2
    tail = [_prompt_number(resumed[k]) for i in range(start, num_iters)
            for rank in range(dp) for k in _replica_reads(i, gbs, mbs, dp, rank, packed)]
    assert tail == [by_position[k] for step in reads[start:] for k in step]
