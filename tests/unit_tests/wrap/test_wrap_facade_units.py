"""Single-process tests of the facade's parts: replica blocks, length limits, field checks,
flows (forms, prompt masking, truncation, mock batches) and the flow registry."""

import contextlib
import dataclasses
import io
import json

import numpy as np
import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.data import replica_block
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.datasets.sft import SFTDataset
from megatron.varlen_training.tokenizer import build_tokenizer
from megatron.wrap import (
    Flow,
    FlowContext,
    GPTFlow,
    GPTSFTFlow,
    MockFlow,
    get_flow_class,
    register_flow,
)
from megatron.wrap.batch import check_batch, check_lengths, length_limit
from megatron.wrap.flows import build_flow, fields

BASE_ARGV = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "64", "--train-iters", "2", "--lr", "1e-3", "--mock-data", "--sft",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--micro-batch-size", "1",
    "--global-batch-size", "4", "--sequence-packing", "--seed", "3",
]


def _args(extra=(), world_size=1, tokenizer="NullTokenizer"):
    argv = BASE_ARGV + list(extra)
    if tokenizer != "NullTokenizer":
        argv[argv.index("NullTokenizer")] = tokenizer
        cut = argv.index("--vocab-size")
        del argv[cut: cut + 2]
    run = parse_run_config(argv, world_size=world_size)
    tok = build_tokenizer(run.data.tokenizer_type, run.model.vocab_size)
    return run.with_vocabulary(tok.vocab_size), tok


def _context(extra=(), tokenizer="NullTokenizer") -> FlowContext:
    run, tok = _args(extra, tokenizer=tokenizer)
    limit, key = length_limit(run)
    return FlowContext(run, tok, limit, key)


# --- replica blocks and limits -----------------------------------------------------------


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_replica_blocks_cover_the_batch_in_order(dp_size):
    for size in range(10):
        items = list(range(size))
        blocks = [replica_block(items, dp_size, rank) for rank in range(dp_size)]
        assert [i for block in blocks for i in block] == items
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
        if size % dp_size == 0:  # pretrain_gpt.py's global batches: equal contiguous blocks
            per = size // dp_size
            for rank, block in enumerate(blocks):
                assert block == items[rank * per:(rank + 1) * per]


@pytest.mark.parametrize("extra, world, expected", [
    ([], 1, (64, "seq_length")),
    (["--context-parallel-size", "2"], 2, (64, "seq_length")),
    (["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "32"], 2, (64, "seq_length")),
])
def test_length_limit(extra, world, expected):
    assert length_limit(parse_run_config(BASE_ARGV + extra, world_size=world)) == expected


def test_batch_checks():
    with pytest.raises(ValueError, match=r"^empty batch: evaluate\(\) needs"):
        check_batch([], "evaluate")
    with pytest.raises(ValueError, match=r"takes a list of samples \(dicts\), got str"):
        check_batch("tokens", "train")
    with pytest.raises(ValueError, match=r"^sample 1, field 'tokens': length 9 exceeds the "
                                         r"limit 8 of this run \(config key 'seq_length'\)"):
        check_lengths([{"length": 8}, {"length": 9}], 8, "seq_length")


# --- field checks ------------------------------------------------------------------------


@pytest.mark.parametrize("value, message", [
    ("1 2 3", "got str '1 2 3'"),
    ([1, True], "item 1 is bool True"),
    ([[1, 2]], "item 0 is list [1, 2]"),
    (torch.tensor([1.0, 2.0]), "got a 1-D torch.float32 tensor"),
    (np.zeros((2, 2), dtype=np.int64), "got a 2-D torch.int64 tensor"),
    ([3, -1], "id -1 at position 1 is outside [0, 10)"),
    (torch.tensor([9, 10]), "id 10 at position 1 is outside [0, 10)"),
    # uint64 ids past int64 wrapped to negative ids in the int64 conversion (a misleading id)
    (np.array([1, 2**63 + 5], dtype=np.uint64),
     "item 1 is 9223372036854775813, outside the int64 range"),
    (torch.tensor(np.array([2**64 - 1], dtype=np.uint64)),
     "item 0 is 18446744073709551615, outside the int64 range"),
])
def test_token_id_errors_name_sample_field_value_and_limit(value, message):
    with pytest.raises(ValueError) as err:
        fields.as_token_ids(value, 4, "tokens", vocab_size=10)
    assert str(err.value).startswith("sample 4, field 'tokens': ") and message in str(err.value)


def test_token_ids_accept_lists_arrays_and_tensors():
    for value in ([1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), torch.tensor([1, 2, 3]),
                  np.array([1, 2, 3], dtype=np.uint64)):
        assert fields.as_token_ids(value, 0, "x", 10).tolist() == [1, 2, 3]
    assert fields.as_per_token_values([1, 0.5, True], 0, "m").tolist() == [1.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="field 'm': expected a list of numbers"):
        fields.as_per_token_values(["a"], 0, "m")
    with pytest.raises(ValueError, match="field 'r': expected a finite number, got inf"):
        fields.as_scalar(float("inf"), 0, "r")


# --- flows -------------------------------------------------------------------------------


def test_data_path_form_uses_the_first_length_entries():
    flow = GPTFlow(_context())
    raw = {"tokens": [1, 2, 3, 127], "labels": [2, 3, 4, 127], "loss_mask": [1, 0, 1, 0],
           "length": 3}
    sample = flow.build_sample(raw, 0)
    assert sample["tokens"].tolist() == [1, 2, 3] and sample["labels"].tolist() == [2, 3, 4]
    assert sample["loss_mask"].tolist() == [1.0, 0.0, 1.0] and sample["length"] == 3
    with pytest.raises(ValueError, match="^sample 2: missing field 'labels'"):
        flow.build_sample({"tokens": [1, 2]}, 2)
    with pytest.raises(ValueError, match=r"field 'length': 5 is outside \[1, 4\]"):
        flow.build_sample({**raw, "length": 5}, 0)


class _AdvantageFlow(GPTSFTFlow):
    def fields_and_seq_dims(self):
        return {**super().fields_and_seq_dims(), "advantages": 0}


def _entries_error(flow, raw) -> str:
    with pytest.raises(ValueError) as err:
        flow.build_sample(raw, 3)
    return str(err.value)


def test_per_token_fields_need_one_entry_per_token():
    """A field longer than the sample was cut to length silently."""
    flow = _AdvantageFlow(_context())
    document = {"prompt_ids": [5, 6], "response_ids": [7, 8]}  # 4 ids: 3 tokens
    assert flow.build_sample({**document, "advantages": [1, 2, 3]}, 0)["advantages"].tolist() \
        == [1.0, 2.0, 3.0]
    for entries in (2, 4):
        assert _entries_error(flow, {**document, "advantages": [0.5] * entries}) == (
            f"sample 3, field 'advantages': has {entries} entries but the sample has 3 tokens; "
            f"give exactly one entry per token")
    data_path = {"tokens": [1, 2, 3], "labels": [2, 3, 4], "advantages": [1, 1, 1]}
    for field, value in (("labels", [2, 3, 4, 5]), ("loss_mask", [1, 1, 1, 0]),
                         ("advantages", [1, 1, 1, 1])):
        assert _entries_error(flow, {**data_path, field: value}) == (
            f"sample 3, field {field!r}: has 4 entries but the sample has 3 tokens; give "
            f"exactly one entry per token")
    # The padded data-path form (length < len(tokens)): padded like tokens, or exactly length.
    padded = {"tokens": [1, 2, 3, 0], "labels": [2, 3, 4, 0], "length": 3}
    for advantages in ([1, 1, 1], [1, 1, 1, 0]):
        assert flow.build_sample({**padded, "advantages": advantages}, 0)["length"] == 3
    assert _entries_error(flow, {**padded, "advantages": [1] * 5}) == (
        "sample 3, field 'advantages': has 5 entries but the sample has 3 tokens (4 entries "
        "with the padding of 'tokens'); give exactly one entry per token")


def test_gpt_sft_prompt_masking_and_input_ids():
    flow = GPTSFTFlow(_context())
    sample = flow.build_sample({"prompt_ids": [5, 6, 7], "response_ids": [8, 9]}, 0)
    assert sample["tokens"].tolist() == [5, 6, 7, 8] and sample["labels"].tolist() == [6, 7, 8, 9]
    assert sample["loss_mask"].tolist() == [0.0, 0.0, 1.0, 1.0]  # labels 8 and 9 are trained
    plain = flow.build_sample({"input_ids": torch.tensor([5, 6, 7])}, 0)
    assert plain["loss_mask"].tolist() == [1.0, 1.0] and plain["length"] == 2
    with pytest.raises(ValueError, match="^sample 0: has 1 token id"):
        flow.build_sample({"input_ids": [5]}, 0)


def test_gpt_sft_text_matches_the_jsonl_dataset(tmp_path):
    records = [{"prompt": "2+2?", "response": "4."},
               {"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello!"}]}]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    context = _context(tokenizer="ByteLevelTokenizer")
    dataset = SFTDataset(str(path), context.tokenizer, context.run.model.seq_length)
    for index, record in enumerate(records):
        got, want = GPTSFTFlow(context).build_sample(record, index), dataset[index]
        for key in ("tokens", "labels", "loss_mask"):
            assert torch.equal(got[key], want[key][: want["length"]]), key
    with pytest.raises(ValueError, match="^sample 0: turn 0 has role 'bot'"):
        GPTSFTFlow(context).build_sample({"messages": [{"role": "bot", "content": "x"}]}, 0)


def test_gpt_sft_truncates_with_a_counted_warning_and_keeps_masked_samples():
    flow = GPTSFTFlow(_context())
    batch = [{"input_ids": list(range(100))}, {"input_ids": [1, 2, 3]},
             {"prompt_ids": [1, 2, 3], "response_ids": []}]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        samples = flow.build_samples(batch)
    assert [s["length"] for s in samples] == [64, 2, 2]
    assert "1 of 3 samples were longer than 64 tokens (config key 'seq_length') and were " \
           "truncated (longest 99)" in out.getvalue()
    assert "1 of 3 samples have no token to train on" in out.getvalue()
    assert not samples[2]["loss_mask"].any()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        flow.build_samples(batch)
    assert out.getvalue() == "", "later batches are counted, not warned about again"
    assert (flow.num_samples, flow.num_truncated, flow.num_fully_masked) == (6, 2, 2)
    kept = GPTSFTFlow(_context(), truncate=False).build_samples(batch[:1])
    with pytest.raises(ValueError, match="length 99 exceeds the limit 64"):
        check_lengths(kept, 64, "seq_length")


def test_mock_flow_batches_are_pretrain_gpts_samples():
    context = _context()
    training = context.run.training
    run = dataclasses.replace(context.run, data=dataclasses.replace(
        context.run.data, train_samples=training.train_iters * training.global_batch_size,
        eval_samples=0))
    dataset, _ = build_datasets(run, context.tokenizer)
    flow = MockFlow(context)
    for step in range(training.train_iters):
        for j, sample in enumerate(flow.make_batch(step)):
            want = dataset[step * training.global_batch_size + j]
            length = want["length"]
            assert sample["length"] == length
            assert torch.equal(sample["tokens"][:length], want["tokens"][:length])
    with pytest.raises(ValueError, match=r"batch 2 is outside \[0, 2\)"):
        flow.make_batch(2)


# --- registry ----------------------------------------------------------------------------


class _TinyFlow(GPTFlow):
    def __init__(self, context, scale: float = 1.0):
        super().__init__(context)
        self.scale = scale


def test_registered_flow_is_built_by_name_with_its_args():
    register_flow("test_tiny", _TinyFlow, replace=True)
    flow = build_flow("test_tiny", _context(), {"scale": 2.0})
    assert isinstance(flow, _TinyFlow) and flow.scale == 2.0 and flow.name == "test_tiny"
    with pytest.raises(ValueError, match=r"flow 'test_tiny': flow.flow_args \['scael'\] do not "
                                         r"fit _TinyFlow"):
        build_flow("test_tiny", _context(), {"scael": 2.0})


def test_unknown_flow_names_the_closest():
    with pytest.raises(ValueError, match=r"unknown flow 'gpt_sfr' \(config key "
                                         r"'flow.flow_name'\); registered: .*gpt_sft.*mock.*; "
                                         r"did you mean 'gpt_sft'\?"):
        get_flow_class("gpt_sfr")


def test_registration_errors():
    with pytest.raises(ValueError, match="already registered"):
        register_flow("gpt_sft", _TinyFlow)
    with pytest.raises(ValueError, match="is not a Flow subclass"):
        register_flow("test_bad", dict)

    class BadDim(GPTFlow):
        def fields_and_seq_dims(self):
            return {**super().fields_and_seq_dims(), "weights": 1}

    with pytest.raises(ValueError, match="field 'weights' has sequence dim 1"):
        BadDim(_context()).extra_fields()
    assert Flow(_context()).extra_fields() == {}
