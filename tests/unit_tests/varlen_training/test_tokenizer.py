"""Tests for megatron/varlen_training/tokenizer.py."""

import pytest

from megatron.varlen_training.tokenizer import (
    BYTE_VOCAB_SIZE,
    ByteLevelTokenizer,
    HuggingFaceTokenizer,
    NullTokenizer,
    build_tokenizer,
)


def _assert_one_line(err: pytest.ExceptionInfo, *needles: str):
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_null_tokenizer_ids_and_specials():
    tok = build_tokenizer("NullTokenizer", vocab_size=10)
    assert (tok.vocab_size, tok.eod, tok.pad) == (10, 9, 9)
    assert tok.tokenize(" 3 0\n9 ") == [3, 0, 9]
    assert tok.detokenize([3, 0, 9]) == "3 0 9"
    assert tok.role_marker("user") == []


@pytest.mark.parametrize("text", ["10", "-1", "a", "1.5", "\u00b2"])
def test_null_tokenizer_rejects_non_ids(text):
    with pytest.raises(ValueError) as err:
        NullTokenizer(10).tokenize(text)
    _assert_one_line(err, repr(text), "--vocab-size")


@pytest.mark.parametrize("vocab_size", [None, 0, 1])
def test_null_tokenizer_needs_vocab_size(vocab_size):
    with pytest.raises(ValueError) as err:
        build_tokenizer("NullTokenizer", vocab_size=vocab_size)
    _assert_one_line(err, "--vocab-size", str(vocab_size))


@pytest.mark.parametrize("text", ["", "hello world", "h\u00e9llo \u2603 \U0001f600", "a\nb\tc"])
def test_byte_level_round_trip(text):
    tok = build_tokenizer("ByteLevelTokenizer")
    ids = tok.tokenize(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.detokenize(ids) == text


def test_byte_level_specials_are_distinct_and_in_vocab():
    tok = ByteLevelTokenizer()
    specials = [tok.eod, tok.pad] + [tok.role_marker(r)[0] for r in ("system", "user", "assistant")]
    assert len(set(specials)) == 5
    assert all(256 <= i < tok.vocab_size == BYTE_VOCAB_SIZE for i in specials)
    assert tok.detokenize([104, tok.eod, 105]) == "h<|eod|>i"
    with pytest.raises(ValueError):
        tok.detokenize([BYTE_VOCAB_SIZE])


def test_unknown_type_names_value_choices_and_flag():
    with pytest.raises(ValueError) as err:
        build_tokenizer("NoSuchTokenizer")
    _assert_one_line(err, "'NoSuchTokenizer'", "--tokenizer-type", "NullTokenizer", "ByteLevel")


def test_huggingface_missing_path_names_path_and_flag(tmp_path):
    missing = str(tmp_path / "no_such_tokenizer")
    for path in (missing, None):
        with pytest.raises(ValueError) as err:
            build_tokenizer("HuggingFaceTokenizer", tokenizer_model=path)
        _assert_one_line(err, repr(path), "--tokenizer-model")


def test_huggingface_missing_transformers_names_path_and_flag(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(ValueError) as err:
        build_tokenizer("HuggingFaceTokenizer", tokenizer_model=str(tmp_path))
    _assert_one_line(err, repr(str(tmp_path)), "--tokenizer-model", "transformers")


class _FakeHF:
    """Tiny stand-in for a transformers tokenizer: one id < 30 per character, 'a' = 0."""

    eos_token_id = 30
    pad_token_id = None

    def __len__(self):
        return 32

    def encode(self, text, add_special_tokens=True):
        assert not add_special_tokens
        return [(ord(c) - ord("a")) % 30 for c in text]

    def decode(self, ids):
        return "".join(chr(i + ord("a")) for i in ids)


def test_huggingface_adapter():
    tok = HuggingFaceTokenizer(_FakeHF())
    assert (tok.vocab_size, tok.eod, tok.pad) == (32, 30, 30)
    assert tok.tokenize("abc") == [0, 1, 2]
    assert tok.detokenize([2, 1, 0]) == "cba"
    assert tok.role_marker("user") == tok.tokenize("<|user|>\n")
