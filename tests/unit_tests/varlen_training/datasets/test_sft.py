"""Tests for megatron/varlen_training/datasets/sft.py.

Expected ids and masks are written out by hand from the template in the module docstring, with
the ByteLevelTokenizer ids: eod 256, system 258, user 259, assistant 260.
"""

import json
from pathlib import Path

import pytest

from megatron.varlen_training.datasets import SFTDataset
from megatron.varlen_training.tokenizer import ByteLevelTokenizer, NullTokenizer

EOD, PAD, SYS, USER, ASSIST = 256, 257, 258, 259, 260
EXAMPLE_FILE = Path(__file__).parents[4] / "examples" / "data" / "sft_tiny.jsonl"

LINE_1 = {"prompt": "hi", "response": "ok"}
LINE_2 = {
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": "bc"},
    ]
}
# Document 1: USER h i EOD ASSIST o k EOD
TOKENS_1 = [USER, 104, 105, EOD, ASSIST, 111, 107]
LABELS_1 = [104, 105, EOD, ASSIST, 111, 107, EOD]
MASK_1 = [0, 0, 0, 0, 1, 1, 1]
# Document 2: SYS s EOD USER q EOD ASSIST a EOD USER r EOD ASSIST b c EOD
TOKENS_2 = [SYS, 115, EOD, USER, 113, EOD, ASSIST, 97, EOD, USER, 114, EOD, ASSIST, 98, 99]
LABELS_2 = [115, EOD, USER, 113, EOD, ASSIST, 97, EOD, USER, 114, EOD, ASSIST, 98, 99, EOD]
MASK_2 = [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]


def _write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(lines))
    return str(path)


def _two_lines(tmp_path):
    return _write(tmp_path, [json.dumps(LINE_1) + "\n", json.dumps(LINE_2) + "\n"])


def test_masking_matches_hand_computed(tmp_path):
    ds = SFTDataset(_two_lines(tmp_path), ByteLevelTokenizer(), seq_length=64)
    assert len(ds) == 2 and ds.lengths.tolist() == [7, 15]
    for i, (tokens, labels, mask) in enumerate(
        [(TOKENS_1, LABELS_1, MASK_1), (TOKENS_2, LABELS_2, MASK_2)]
    ):
        s = ds[i]
        assert s["tokens"].tolist() == tokens and s["labels"].tolist() == labels
        assert s["loss_mask"].tolist() == mask
        assert s["length"] == s["padded_length"] == len(tokens) and s["sample_id"] == i
        assert s["num_loss_tokens"] == sum(mask)


def test_padding_to_multiple_and_to_seq_length(tmp_path):
    path = _two_lines(tmp_path)
    s = SFTDataset(path, ByteLevelTokenizer(), 64, pad_to_multiple_of=4)[0]
    assert s["padded_length"] == 8
    assert s["tokens"].tolist() == TOKENS_1 + [PAD] and s["labels"].tolist() == LABELS_1 + [PAD]
    assert s["loss_mask"].tolist() == MASK_1 + [0]
    s = SFTDataset(path, ByteLevelTokenizer(), 20, pad_to_multiple_of=4, pad_to_seq_length=True)[1]
    assert s["padded_length"] == 20 and s["length"] == 15
    assert s["loss_mask"].tolist() == MASK_2 + [0] * 5
    assert s["position_ids"].tolist() == list(range(20))


def test_truncation_count_and_warning(tmp_path, capsys):
    ds = SFTDataset(_two_lines(tmp_path), ByteLevelTokenizer(), seq_length=10)
    assert ds.num_truncated == 1 and ds.lengths.tolist() == [7, 10]
    s = ds[1]
    assert s["tokens"].tolist() == TOKENS_2[:10] and s["labels"].tolist() == LABELS_2[:10]
    assert s["loss_mask"].tolist() == MASK_2[:10]
    warnings = [line for line in capsys.readouterr().out.splitlines() if "truncated" in line]
    assert len(warnings) == 1 and "1 of 2" in warnings[0] and "--seq-length 10" in warnings[0]
    assert "WARNING" in warnings[0]


def test_truncation_can_leave_a_fully_masked_sample(tmp_path, capsys):
    ds = SFTDataset(_two_lines(tmp_path), ByteLevelTokenizer(), seq_length=5)
    assert (ds.num_truncated, ds.num_fully_masked) == (2, 1)
    assert ds[0]["loss_mask"].tolist() == MASK_1[:5]
    assert ds[1]["loss_mask"].tolist() == [0] * 5 and ds[1]["num_loss_tokens"] == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("WARNING" in line and "no assistant/response token" in line
               for line in lines) == 1


def test_fully_masked_sample_is_valid(tmp_path):
    path = _write(tmp_path, [json.dumps({"messages": [{"role": "user", "content": "x"}]})])
    s = SFTDataset(path, ByteLevelTokenizer(), 8, pad_to_multiple_of=4)[0]
    assert s["tokens"].tolist() == [USER, 120, PAD, PAD]
    assert s["labels"].tolist() == [120, EOD, PAD, PAD]
    assert s["loss_mask"].tolist() == [0, 0, 0, 0] and s["num_loss_tokens"] == 0


def test_null_tokenizer_template(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "1 2", "response": "3"})])
    s = SFTDataset(path, NullTokenizer(10), 8)[0]
    # document: 1 2 EOD(9) 3 EOD(9); no role markers
    assert s["tokens"].tolist() == [1, 2, 9, 3] and s["labels"].tolist() == [2, 9, 3, 9]
    assert s["loss_mask"].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"text": "x"}', "'messages' key or both 'prompt' and 'response'"),
        ('{"mesages": [], "id": 1}', "(--sft-messages-key, --sft-prompt-key, --sft-response-key)"
                                     "; its keys are 'mesages', 'id'"),
        ('{"prompt": "x"}', "'messages' key or both 'prompt' and 'response'"),
        ('{"messages": []}', "'messages' must be a non-empty list"),
        ('{"messages": ["hi"]}', "message 0 is not an object"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "turn 0 has role 'bot'"),
        ('{"messages": [{"role": "user"}]}', "turn 0 content must be a string, got NoneType"),
        # Megatron-LM's SFT would read two conversations packed in one line
        ('{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, '
         '{"role": "assistant", "content": "a"}, {"role": "system", "content": "t"}, '
         '{"role": "user", "content": "r"}]}',
         "turn 3 is a system message after the conversation's start, which Megatron-LM's SFT "
         "reads as the start of another conversation in the same record"),
        ('{"prompt": "x", "response": 3}', "turn 1 content must be a string, got int"),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, bad_line, problem):
    path = _write(tmp_path, [json.dumps(LINE_1) + "\n", "\n", bad_line + "\n"])
    with pytest.raises(ValueError) as err:
        SFTDataset(path, ByteLevelTokenizer(), 16)
    message = str(err.value)
    assert "\n" not in message and f"{path}:3: " in message and problem in message


def test_tokenizer_error_and_too_short_sample_name_the_line(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "1 x", "response": "2"})])
    with pytest.raises(ValueError, match=r"data.jsonl:1: NullTokenizer: 'x'"):
        SFTDataset(path, NullTokenizer(10), 8)
    path = _write(tmp_path, [json.dumps({"messages": [{"role": "user", "content": ""}]})])
    with pytest.raises(ValueError, match=r"data.jsonl:1: sample has 1 token\(s\)"):
        SFTDataset(path, NullTokenizer(10), 8)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path, content):
    path = _write(tmp_path, [content])
    with pytest.raises(ValueError, match="has no samples .--data-path."):
        SFTDataset(path, ByteLevelTokenizer(), 8)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist .--data-path."):
        SFTDataset(str(tmp_path / "nope.jsonl"), ByteLevelTokenizer(), 8)


def test_samples_are_fresh_objects(tmp_path):
    ds = SFTDataset(_two_lines(tmp_path), ByteLevelTokenizer(), 64)
    first = ds[0]
    first["tokens"].fill_(0)
    first["loss_mask"].fill_(1)
    first["num_loss_tokens"] = 99
    again = ds[0]
    assert again["tokens"].tolist() == TOKENS_1 and again["loss_mask"].tolist() == MASK_1
    assert again["num_loss_tokens"] == 3


def test_shipped_example_file_loads():
    tok = ByteLevelTokenizer()
    ds = SFTDataset(str(EXAMPLE_FILE), tok, 512, pad_to_multiple_of=8)
    assert len(ds) == 40 and ds.num_truncated == 0 and ds.num_fully_masked == 0
    assert len(set(ds.lengths.tolist())) > 30
    for i in range(len(ds)):
        s = ds[i]
        assert s["tokens"].max() < tok.vocab_size and s["padded_length"] % 8 == 0
        assert s["num_loss_tokens"] > 0


def _samples(dataset) -> list[tuple[list, list, list]]:
    return [(s["tokens"].tolist(), s["labels"].tolist(), s["loss_mask"].tolist())
            for s in (dataset[i] for i in range(len(dataset)))]


def test_byte_order_mark_crlf_and_blank_lines_change_no_sample(tmp_path):
    """A file a Windows tool wrote (UTF-8 byte order mark, CRLF line ends, blank lines) gives
    the hand-computed samples of the plain file."""
    text = "\r\n".join([json.dumps(LINE_1), "", json.dumps(LINE_2), "  "]) + "\r\n"
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    got = _samples(SFTDataset(str(path), ByteLevelTokenizer(), seq_length=64))
    assert got == [(TOKENS_1, LABELS_1, MASK_1), (TOKENS_2, LABELS_2, MASK_2)]


def _with(record: dict, **extra) -> dict:
    return {**record, **extra}


def _assistant_with(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "ok", **extra}]}


@pytest.mark.parametrize("record, needle", [
    (_with(LINE_2, labels=[115, 256]), "key 'labels' (pre-tokenised or pre-masked data) would "
                                       "be ignored: --sft tokenizes the conversation"),
    (_with(LINE_2, loss_mask=[0, 1]), "key 'loss_mask'"),
    (_with(LINE_1, input_ids=[1, 2, 3]), "key 'input_ids'"),
    (_with(LINE_1, tokens=[1, 2], attention_mask=[1, 1]), "key 'tokens'"),
    (_with(LINE_2, assistant_masks=[0, 1]), "key 'assistant_masks'"),
    (_with(LINE_1, context_token_length=2), "key 'context_token_length'"),
    (_assistant_with(weight=0), "message 1 (assistant) has weight 0, but --sft trains every "
                                "assistant turn and no other (weight 1 here)"),
    ({"messages": [{"role": "user", "content": "hi", "weight": 1},
                   {"role": "assistant", "content": "ok"}]}, "message 0 (user) has weight 1"),
    (_assistant_with(tool_calls=[{"name": "f"}]), "message 1 has 'tool_calls', which --sft "
                                                   "does not pass to the template"),
    (_assistant_with(reasoning_content="think"), "message 1 has 'reasoning_content'"),
])
def test_fields_that_would_be_ignored_are_refused(tmp_path, record, needle):
    """Pre-tokenised or pre-masked keys beside the conversation, and message fields that
    change what a turn trains on, are one line naming the line and the field (they used to be
    dropped without a word)."""
    path = _write(tmp_path, [json.dumps(LINE_1) + "\n", json.dumps(record) + "\n"])
    with pytest.raises(ValueError) as err:
        SFTDataset(path, ByteLevelTokenizer(), 64)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}:2: ") and needle in message


def test_metadata_null_fields_and_agreeing_weights_are_read_as_before(tmp_path):
    """Metadata keys (id, source, a prompt beside the messages, a scalar under a per-token name:
    a classification label, a token count), null pre-tokenised keys, empty tool calls and
    reasoning, and weights that say what --sft trains anyway leave the hand-computed samples
    unchanged."""
    assistant_weighted = {"messages": [
        {**m, "weight": int(m["role"] == "assistant"), "tool_calls": [], "reasoning_content": ""}
        if m["role"] != "system" else m for m in LINE_2["messages"]]}
    lines = [_with(LINE_1, id=7, source="web", labels=None, input_ids=None),
             _with(assistant_weighted, prompt="unrelated", labels="positive", tokens=42)]
    path = _write(tmp_path, [json.dumps(line) + "\n" for line in lines])
    got = _samples(SFTDataset(path, ByteLevelTokenizer(), seq_length=64))
    assert got == [(TOKENS_1, LABELS_1, MASK_1), (TOKENS_2, LABELS_2, MASK_2)]
