"""A sample key that the flow does not read is refused in one line, never dropped (docs/WRAP.md
section 3, "Fields a flow does not read"): per form of every built-in flow, for the datasets'
own samples (which must still train as they are), for metadata listed in
``flow.ignored_fields`` and for a flow's declared extra fields. The entry-point test (a script
under torchrun: one line, exit code 2) is in ``test_wrap_script_errors.py``."""

import json

import pytest
import torch

from megatron.varlen_training.datasets.sample import SAMPLE_KEYS
from megatron.varlen_training.datasets.sft import SFTDataset
from megatron.wrap import GPTFlow, GPTSFTFlow, MockFlow, register_flow
from megatron.wrap.config import ConfigError, build_config
from megatron.wrap.flows import MinimalMockFlow, build_flow, fields, ignored_fields
from megatron.wrap.flows.base import FlowContext
from tests.unit_tests.wrap.megatron_wrap_format import VIEW, write_nest
from tests.unit_tests.wrap.test_wrap_facade_units import _AdvantageFlow, _context

HOW = ("declare a field in the flow's fields_and_seq_dims() to have it packed for the loss, list "
       "it in config key 'flow.ignored_fields' if it is metadata not to train on, or drop it "
       "from the sample")
DATA_PATH = {"tokens": [1, 2, 3], "labels": [2, 3, 4]}
DATA_PATH_READS = "tokens, labels, loss_mask, length, position_ids"


def _error(flow, raw, index=3) -> str:
    with pytest.raises(fields.BatchError) as err:
        flow.build_sample(raw, index)
    return str(err.value)


def _same_sample(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value) if torch.is_tensor(value) else got[key] == value, key


def _context_ignoring(*names, tokenizer="NullTokenizer") -> FlowContext:
    context = _context(tokenizer=tokenizer)
    return FlowContext(context.run, context.tokenizer, context.max_length,
                       context.max_length_key, names)


class _MockLikeFlow(GPTFlow):  # the plain GPT flow of `mock`, without its dataset
    name = "gpt"


# --- what each form reads ------------------------------------------------------------------


@pytest.mark.parametrize("flow_class", [_MockLikeFlow, GPTSFTFlow])
def test_data_path_form_refuses_rl_fields_it_does_not_read(flow_class):
    """The issue's case: advantages and rewards given to a flow that has no use for them."""
    flow = flow_class(_context())
    raw = {**DATA_PATH, "advantages": [0.5, 1.0, -1.0], "rewards": 2.0}
    assert _error(flow, raw) == (
        f"sample 3, fields 'advantages', 'rewards': flow {flow.name!r} does not read them (it "
        f"reads {DATA_PATH_READS} from a sample of this form); {HOW}")


def test_mistyped_loss_mask_is_refused_not_trained_without_it():
    flow = GPTSFTFlow(_context())
    assert _error(flow, {"input_ids": [1, 2, 3], "loss_maks": [0, 1]}, 0) == (
        f"sample 0, field 'loss_maks': flow 'gpt_sft' does not read it (it reads input_ids, "
        f"context_token_length from a sample of this form); {HOW}")
    assert "field 'loss_maks'" in _error(flow, {**DATA_PATH, "loss_maks": [0, 1, 1]})


@pytest.mark.parametrize("raw, unread, reads", [
    ({"prompt": "2+2?", "response": "4.", "labels": [1, 2]}, "labels", "prompt, response"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
      "prompt": "ignored by parse_turns"}, "prompt", "messages"),
    ({"prompt_ids": [5, 6], "response_ids": [7], "loss_mask": [1, 1]}, "loss_mask",
     "prompt_ids, response_ids"),
    ({"input_ids": [5, 6, 7], "length": 2}, "length", "input_ids, context_token_length"),
    ({**DATA_PATH, "input_ids": [9, 9]}, "input_ids", DATA_PATH_READS),  # first form wins
])
def test_gpt_sft_refuses_keys_of_other_forms(raw, unread, reads):
    flow = GPTSFTFlow(_context(tokenizer="ByteLevelTokenizer"))
    assert _error(flow, raw) == (f"sample 3, field {unread!r}: flow 'gpt_sft' does not read it "
                                 f"(it reads {reads} from a sample of this form); {HOW}")


def test_computed_loss_weight_is_not_read_from_samples():
    """With per-sample normalisation the flow computes loss_weight; a sample's own is refused."""
    flow = GPTSFTFlow(_context(), loss_normalization="sample")
    assert flow.build_samples([{"input_ids": [1, 2, 3]}])[0]["loss_weight"].tolist() == [1, 1]
    assert "field 'loss_weight': flow 'gpt_sft' does not read it" in _error(
        flow, {"input_ids": [1, 2, 3], "loss_weight": [2.0, 2.0]})


def test_declared_extra_field_is_read_in_every_form():
    flow = _AdvantageFlow(_context(tokenizer="ByteLevelTokenizer"))
    for raw in ({**DATA_PATH, "advantages": [1, 2, 3]},
                {"input_ids": [1, 2, 3, 4], "advantages": [1, 2, 3]},
                {"prompt_ids": [1, 2], "response_ids": [3, 4], "advantages": [1, 2, 3]}):
        assert flow.build_sample(raw, 0)["advantages"].tolist() == [1.0, 2.0, 3.0]
    message = _error(flow, {"input_ids": [1, 2, 3, 4], "advantages": [1, 2, 3], "reward": 1})
    assert message.startswith(f"sample 3, field 'reward': flow {flow.name!r} does not read it "
                              f"(it reads input_ids, context_token_length, advantages from a "
                              f"sample of this form)")


def test_position_ids_are_checked_not_replaced():
    flow = GPTSFTFlow(_context())
    plain = flow.build_sample(DATA_PATH, 0)
    for positions in ([0, 1, 2], [0, 1, 2, 3]):  # exactly length, or padded like tokens
        raw = {"tokens": [1, 2, 3, 0], "labels": [2, 3, 4, 0], "length": 3}
        _same_sample(flow.build_sample({**raw, "position_ids": positions}, 0), plain)
    assert _error(flow, {**DATA_PATH, "position_ids": [0, 1, 0]}) == (
        "sample 3, field 'position_ids': entry 2 is 0, not 2: each sample is packed as one "
        "sequence with positions 0..length-1; drop the field, or give each document as a "
        "sample of its own")


# --- the datasets' samples and declared metadata --------------------------------------------


def test_mock_dataset_samples_train_as_they_are():
    """The datasets' bookkeeping keys (SAMPLE_KEYS) are accepted unread; the sample built from
    a dataset sample equals the one built from its read fields alone."""
    flow = MockFlow(_context())
    batch = flow.make_batch(0)
    assert all(set(raw) == set(SAMPLE_KEYS) for raw in batch)
    for index, raw in enumerate(batch):
        read = {key: raw[key] for key in ("tokens", "labels", "loss_mask", "length")}
        for other in (flow, GPTSFTFlow(flow.context)):
            _same_sample(other.build_sample(raw, index), flow.build_sample(read, index))


def test_sft_dataset_samples_train_as_they_are(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "response": "4."}) + "\n")
    context = _context(tokenizer="ByteLevelTokenizer")
    raw = SFTDataset(str(path), context.tokenizer, context.run.model.seq_length)[0]
    _same_sample(GPTSFTFlow(context).build_sample(raw, 0),
                 GPTSFTFlow(context).build_sample({"prompt": "2+2?", "response": "4."}, 0))


def test_ignored_fields_are_accepted_and_change_nothing():
    context = _context_ignoring("id", "source", tokenizer="ByteLevelTokenizer")
    flow = GPTSFTFlow(context)
    for raw in ({"prompt": "2+2?", "response": "4."}, {"input_ids": [1, 2, 3]}, DATA_PATH):
        _same_sample(flow.build_sample({**raw, "id": "row-7", "source": "gsm8k"}, 0),
                     flow.build_sample(raw, 0))
    assert "field 'label': flow 'gpt_sft' does not read it" in _error(
        flow, {"prompt": "2+2?", "response": "4.", "id": 7, "label": 1})


def test_flow_class_may_declare_its_ignored_fields():
    class RowIdFlow(GPTSFTFlow):
        ignored_fields = ("row_id",)

    flow = RowIdFlow(_context())
    _same_sample(flow.build_sample({**DATA_PATH, "row_id": 3}, 0),
                 flow.build_sample(DATA_PATH, 0))


def test_ignoring_a_field_the_flow_reads_is_a_config_error():
    class Advantages(_AdvantageFlow):  # registering names the class: keep _AdvantageFlow's
        pass

    register_flow("test_advantages", Advantages, replace=True)
    for name in ("labels", "advantages"):
        with pytest.raises(ConfigError, match=f"names '{name}', which flow 'test_advantages' "
                                              f"reads"):
            build_flow("test_advantages", _context_ignoring(name), None)
    with pytest.raises(ConfigError, match="'flow.ignored_fields' must be a list of sample field "
                                          "names, got 3"):
        ignored_fields(["id", 3])
    assert ignored_fields(["id"]) == ("id",) and ignored_fields(None) == ()


def test_ignored_fields_config_key_in_both_config_formats(tmp_path):
    native = build_config({"flow": {"flow_name": "gpt_sft", "ignored_fields": ["id"]}})
    assert native.facade["ignored_fields"] == ["id"]
    assert build_config({}).facade["ignored_fields"] == []
    view = VIEW.replace("    __select__: gpt_sft\n", "    __select__: gpt_sft\n    __override__:\n"
                                                    "      ignored_fields: [id]\n")
    config = build_config(write_nest(tmp_path, view))
    assert config.facade["ignored_fields"] == ["id"] and config.facade["flow_args"] == {}


def test_minimal_mock_reads_no_field_by_design():
    flow = MinimalMockFlow(_context())
    samples = flow.build_samples([[0], {"anything": 1}])
    assert [sorted(sample) for sample in samples] == [["labels", "length", "loss_mask",
                                                       "tokens"]] * 2


@pytest.mark.parametrize("extra, needle", [
    ({"weight": 0}, "message 1 (assistant) has weight 0, but --sft trains every assistant turn"),
    ({"tool_calls": [{"name": "f"}]}, "message 1 has 'tool_calls', which --sft does not pass"),
])
def test_message_fields_the_template_would_drop_are_refused(extra, needle):
    """A text sample's message fields that change what its turn trains on (OpenAI's
    per-message weight, tool calls) are refused as the --sft datasets refuse them."""
    flow = GPTSFTFlow(_context(tokenizer="ByteLevelTokenizer"))
    raw = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a", **extra}]}
    message = _error(flow, raw)
    assert message.startswith("sample 3") and needle in message
