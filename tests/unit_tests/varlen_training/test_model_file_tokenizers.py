"""Megatron-LM's SentencePiece types (SentencePieceTokenizer, GPTSentencePieceTokenizer,
Llama2Tokenizer) and TikTokenizer, from ``--tokenizer-model FILE``: ids equal to the packages'
own encoding of tiny models made here (the sentencepiece processor over the same model; a
``tiktoken.Encoding`` built from the same ranks with Megatron-LM's layout), Megatron-LM's
eod/pad/special-token ids and padded vocabulary, its flags, and one-line refusals of bad
values and files. Megatron-LM's facts (its default, megatron-core's tokenizer libraries): the
three SentencePiece types encode with the model alone (no BOS), eod = the model's eos; the
TikToken special tokens are ``<unk> <s> </s> <mask> <pad> <cls> <sep>`` then ``<SPECIAL_i>``
fillers, ids 0.., eod ``</s>``, pad ``<pad>``, the vocabulary ``--vocab-size`` (2^17 unset)."""

from __future__ import annotations

import socket
import sys

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.tokenizer import build_tokenizer
from megatron.varlen_training.model_file_tokenizers import ModelFileOptions
from tests.harness.extras import needs_extra
from tests.harness.training_runs import TINY_GPT_ARGS
from tests.unit_tests.varlen_training.model_files import (
    TEXTS, tiktoken_ranks, tiktoken_reference, train_sentencepiece, write_tiktoken_vocab,
)

pytestmark = needs_extra("tokenizers")
SENTENCEPIECE_TYPES = ["SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"]
SPECIAL = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]  # Megatron-LM's, in order
EOS, PAD = SPECIAL.index("</s>"), SPECIAL.index("<pad>")
NUM_SPECIAL = 10  # --tiktoken-num-special-tokens of the tiny vocabulary: 3 fillers
_AT = TINY_GPT_ARGS.index("--vocab-size")
TINY_ARGS_NO_VOCAB = TINY_GPT_ARGS[:_AT] + TINY_GPT_ARGS[_AT + 2:]  # the tokenizer sizes it


def _fillers(count: int, first: int) -> list[str]:
    return [f"<SPECIAL_{i}>" for i in range(first, count)]


def _full_vocab() -> int:
    return NUM_SPECIAL + len(tiktoken_ranks())


def _pattern(name: str) -> str:
    """Megatron-LM's pre-tokenizer regexes (facts, as megatron-core ships them)."""
    from megatron.core.tokenizers.text.libraries import tiktoken_tokenizer

    return {"v1": tiktoken_tokenizer._PATTERN_TIKTOKEN_V1,
            "v2": tiktoken_tokenizer._PATTERN_TIKTOKEN_V2}[name]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    return train_sentencepiece(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def processor(spm):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(spm))


@pytest.fixture(scope="module")
def vocab_json(tmp_path_factory):
    return write_tiktoken_vocab(tmp_path_factory.mktemp("tiktoken"))


def _tiktoken(vocab_json, pattern=None, special=None, vocab_size=None,
              num_special=NUM_SPECIAL):
    return build_tokenizer("TikTokenizer", vocab_size or _full_vocab(), str(vocab_json),
                           options=ModelFileOptions(pattern, num_special, special))


# --- SentencePiece types --------------------------------------------------------------------

@pytest.mark.parametrize("kind", SENTENCEPIECE_TYPES)
@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_ids_are_the_models_own_encoding(spm, processor, kind, text):
    tokenizer = build_tokenizer(kind, tokenizer_model=str(spm))
    ids = tokenizer.tokenize(text)
    assert ids == processor.encode(text)  # no BOS added (Megatron-LM's default, all three)
    assert tokenizer.detokenize(ids) == processor.decode(ids)


@pytest.mark.parametrize("kind", SENTENCEPIECE_TYPES)
def test_sentencepiece_eod_pad_and_vocabulary(spm, processor, kind):
    tokenizer = build_tokenizer(kind, tokenizer_model=str(spm))
    assert tokenizer.vocab_size == processor.get_piece_size()
    assert tokenizer.eod == processor.eos_id() != processor.bos_id()
    assert processor.pad_id() == -1 and tokenizer.pad == tokenizer.eod  # no pad piece: eod


def test_sentencepiece_pad_piece_is_the_pad(tmp_path):
    import sentencepiece

    model = train_sentencepiece(tmp_path, pad_id=3)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    tokenizer = build_tokenizer("Llama2Tokenizer", tokenizer_model=str(model))
    assert tokenizer.pad == processor.pad_id() == 3
    assert tokenizer.eod == processor.eos_id()


@pytest.mark.parametrize("options, needle", [
    ({"eos_id": -1}, "no end-of-sentence piece"),
])
def test_sentencepiece_model_without_eos_is_one_line(tmp_path, options, needle):
    model = train_sentencepiece(tmp_path, **options)
    with pytest.raises(ValueError, match=needle) as err:
        build_tokenizer("GPTSentencePieceTokenizer", tokenizer_model=str(model))
    assert "\n" not in str(err.value) and str(model) in str(err.value)


@pytest.mark.parametrize("flag", ["--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
                                  "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces"])
def test_keeping_extra_whitespace_is_megatron_cores_placeholder_encoding(spm, processor, flag):
    """Megatron-LM's flag reaches megatron-core's SentencePiece library (its meaning: runs of
    spaces the model collapses kept as pieces); by default the model's own encoding."""
    from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
    )

    from megatron.varlen_training.tokenizer import build_run_tokenizer

    run = parse_run_config(TINY_ARGS_NO_VOCAB + ["--train-iters", "1", "--tokenizer-type",
                                                 "Llama2Tokenizer", "--tokenizer-model",
                                                 str(spm), flag])
    assert run.data.tokenizer_sentencepiece_ignore_extra_whitespaces is False
    tokenizer = build_run_tokenizer(run.data, run.model.vocab_size)
    library = SentencePieceTokenizer(str(spm), ignore_extra_whitespaces=False)
    text = "a   b  two  spaces"
    assert processor.decode(processor.encode(text)) != text  # the model collapses them
    assert tokenizer.tokenize(text) == library.text_to_ids(text) != processor.encode(text)
    assert tokenizer.detokenize(tokenizer.tokenize(text)) == text


def test_keeping_extra_whitespace_beside_another_type_is_refused(vocab_json):
    message = _refusal("--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab_json),
                       "--no-tokenizer-sentencepiece-ignore-extra-whitespaces")
    assert "configures the SentencePiece types, but --tokenizer-type is TikTokenizer" in message


def test_bad_sentencepiece_files_are_one_line(tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00not a model\xff" * 10)
    for path, needle in [(garbage, "is not a SentencePiece model"),
                         (tmp_path / "missing.model", "is not a file")]:
        with pytest.raises(ValueError, match=needle) as err:
            build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(path))
        assert "\n" not in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "TikTokenizer"])
def test_sft_turns_open_with_text_markers(spm, processor, vocab_json, kind):
    """--sft with these types: each turn is the text ``<|role|>\\n`` (as a Hugging Face
    tokenizer without a chat template), its content's ids and the eod; the loss on the
    assistant's content and eod only."""
    from megatron.varlen_training.datasets.sft import encode_turns

    if kind == "TikTokenizer":
        tokenizer = _tiktoken(vocab_json)
        encode = tiktoken_reference(_pattern("v2"), SPECIAL + _fillers(NUM_SPECIAL, 7),
                                    _full_vocab()).encode
        eod = EOS
    else:
        tokenizer = build_tokenizer(kind, tokenizer_model=str(spm))
        encode, eod = processor.encode, processor.eos_id()
    turns = [("user", "hello world"), ("assistant", "the cafe")]
    ids, is_target = encode_turns(turns, tokenizer)
    expected, target = [], []
    for role, content in turns:
        marker, body = encode(f"<|{role}|>\n"), encode(content) + [eod]
        expected += marker + body
        target += [False] * len(marker) + [role == "assistant"] * len(body)
    assert ids.tolist() == expected and is_target.tolist() == target


# --- TikTokenizer ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [None, "v1", "v2"])
@pytest.mark.parametrize("text", TEXTS)
def test_tiktoken_ids_are_tiktokens_own_encoding(vocab_json, pattern, text):
    tokenizer = _tiktoken(vocab_json, pattern)
    special = SPECIAL + _fillers(NUM_SPECIAL, len(SPECIAL))
    reference = tiktoken_reference(_pattern(pattern or "v2"), special, _full_vocab())
    ids = tokenizer.tokenize(text)
    assert ids == reference.encode(text, allowed_special="all")  # specials in text: their ids
    assert tokenizer.detokenize(ids) == reference.decode(ids)


def test_the_two_patterns_split_differently(vocab_json):
    """The pattern reaches tiktoken: v1 keeps "HelloWorld" one piece, merging "oW"."""
    text = "HelloWorld"
    assert _tiktoken(vocab_json, "v1").tokenize(text) != _tiktoken(vocab_json, "v2").tokenize(text)


def test_tiktoken_special_ids_and_vocabulary(vocab_json):
    tokenizer = _tiktoken(vocab_json)
    assert (tokenizer.eod, tokenizer.pad, tokenizer.vocab_size) == (EOS, PAD, _full_vocab())
    assert tokenizer.tokenize("<SPECIAL_9><s></s>") == [9, SPECIAL.index("<s>"), EOS]
    assert tokenizer.tokenize("\x00") == [NUM_SPECIAL]  # the first rank follows the specials


def test_tiktoken_custom_special_tokens_set_the_ids(vocab_json):
    special = ["<pad>", "<extra>", *reversed(SPECIAL[:4]), "<cls>", "<sep>"]  # 8 of 10
    tokenizer = _tiktoken(vocab_json, special=tuple(special))
    assert (tokenizer.eod, tokenizer.pad) == (special.index("</s>"), 0)
    assert tokenizer.tokenize("<extra><SPECIAL_9>") == [1, 9]
    reference = tiktoken_reference(_pattern("v2"), special + _fillers(NUM_SPECIAL, 8),
                                   _full_vocab())
    assert tokenizer.tokenize(TEXTS[3]) == reference.encode(TEXTS[3], allowed_special="all")


def test_tiktoken_vocabulary_cuts_the_ranks(vocab_json):
    """--vocab-size below the file's: Megatron-LM keeps the first ranks only."""
    size = NUM_SPECIAL + 256 + 2  # the bytes and the first two merges ("he", "ll")
    tokenizer = _tiktoken(vocab_json, vocab_size=size)
    reference = tiktoken_reference(_pattern("v2"), SPECIAL + _fillers(NUM_SPECIAL, 7), size)
    assert tokenizer.vocab_size == size
    assert tokenizer.tokenize("hello world") == reference.encode("hello world")
    assert max(tokenizer.tokenize(" ".join(TEXTS))) < size


def test_tiktoken_never_reaches_the_network(vocab_json, monkeypatch):
    """No named encoding is fetched: building and encoding work with sockets refused."""
    import tiktoken

    def refuse(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(tiktoken, "get_encoding", refuse)
    assert _tiktoken(vocab_json).tokenize("hello world")


@pytest.mark.parametrize("edit, needle", [
    (lambda entries: entries[:100], "has 100 ranks but the vocabulary needs"),
    (lambda entries: [{**e, "rank": e["rank"] + 1} for e in entries], "entry 0 is not"),
    (lambda entries: entries[1:], "entry 0 is not"),
    (lambda entries: {"not": "a list"}, "not a JSON list"),
    (lambda entries: [{**e, "token_bytes": "!!"} for e in entries], "not base64"),
])
def test_bad_tiktoken_vocabularies_are_one_line(vocab_json, tmp_path, edit, needle):
    import json

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(json.loads(vocab_json.read_text()))), encoding="utf-8")
    with pytest.raises(ValueError, match=needle) as err:
        _tiktoken(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)


def test_tiktoken_needs_a_json_file(tmp_path):
    other = tmp_path / "tokenizer.model"
    other.write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match="vocabulary JSON"):
        _tiktoken(other)


# --- flags ----------------------------------------------------------------------------------

def _parse(*flags: str):
    return parse_args(TINY_ARGS_NO_VOCAB + ["--train-iters", "1", *flags], world_size=1)


def _refusal(*flags: str) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        _parse(*flags)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("kind", [*SENTENCEPIECE_TYPES, "TikTokenizer"])
@pytest.mark.parametrize("divisible_by, tp", [(128, 1), (7, 2)])
def test_padded_vocabulary_as_megatron_lm(spm, vocab_json, kind, divisible_by, tp):
    model = vocab_json if kind == "TikTokenizer" else spm
    sizes = ["--vocab-size", str(_full_vocab()), "--tiktoken-num-special-tokens",
             str(NUM_SPECIAL)] if kind == "TikTokenizer" else []
    run = parse_run_config(
        TINY_ARGS_NO_VOCAB + ["--train-iters", "1", "--tokenizer-type", kind, "--tokenizer-model",
                              str(model), "--make-vocab-size-divisible-by", str(divisible_by),
                              "--tensor-model-parallel-size", str(tp), *sizes], world_size=tp)
    from megatron.varlen_training.tokenizer import build_run_tokenizer

    tokenizer = build_run_tokenizer(run.data, run.model.vocab_size)
    model_config = run.with_vocabulary(tokenizer.vocab_size).model
    multiple = divisible_by * tp
    padded = -(-tokenizer.vocab_size // multiple) * multiple  # Megatron-LM: ceil to a multiple
    assert (model_config.vocab_size, model_config.padded_vocab_size) == \
        (tokenizer.vocab_size, padded)


def test_run_config_carries_the_tiktoken_flags(vocab_json):
    run = parse_run_config(
        TINY_ARGS_NO_VOCAB + ["--train-iters", "1", "--tokenizer-type", "TikTokenizer",
                              "--tokenizer-model", str(vocab_json), "--vocab-size",
                              str(_full_vocab()), "--tiktoken-pattern", "v1",
                              "--tiktoken-num-special-tokens", "9",
                              "--tiktoken-special-tokens", *SPECIAL, "<x>"])
    data = run.data
    assert (data.tiktoken_pattern, data.tiktoken_num_special_tokens) == ("v1", 9)
    assert data.tokenizer_special_tokens == (*SPECIAL, "<x>")  # the older flag's value


def test_megatron_lms_unset_tiktoken_values_are_megatron_cores_defaults():
    args = _parse("--tokenizer-type", "ByteLevelTokenizer")
    assert (args.tiktoken_pattern, args.tiktoken_num_special_tokens,
            args.tokenizer_special_tokens) == (None, 1000, None)
    from megatron.core.tokenizers.text.libraries import tiktoken_tokenizer

    assert tiktoken_tokenizer.SPECIAL_TOKENS == SPECIAL
    assert tiktoken_tokenizer.DEFAULT_TIKTOKEN_MAX_VOCAB == 2**17


@pytest.mark.parametrize("kind", [*SENTENCEPIECE_TYPES, "TikTokenizer"])
def test_the_types_need_their_model_file(kind):
    message = _refusal("--tokenizer-type", kind)
    assert f"--tokenizer-type {kind} needs --tokenizer-model" in message


@pytest.mark.parametrize("flags, needle", [
    (["--tiktoken-pattern", "v1"], "--tiktoken-pattern v1 configures --tokenizer-type "
                                   "TikTokenizer, but --tokenizer-type is Llama2Tokenizer"),
    (["--tiktoken-num-special-tokens", "20"], "--tiktoken-num-special-tokens 20 configures"),
    (["--tokenizer-special-tokens", "<a>"], "--tokenizer-special-tokens <a>: special tokens "
                                            "are added for --tokenizer-type TikTokenizer only"),
    (["--tiktoken-special-tokens", "<a>"], "--tokenizer-special-tokens <a>"),
    (["--tokenizer-sentencepiece-legacy"], "--tokenizer-sentencepiece-legacy"),
])
def test_tiktoken_flags_beside_another_type_are_refused(spm, flags, needle):
    message = _refusal("--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", str(spm),
                       *flags)
    assert needle in message


def test_megatron_lms_defaults_beside_another_type_change_nothing(spm):
    _parse("--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", str(spm),
           "--tiktoken-num-special-tokens", "1000")


@pytest.mark.parametrize("flags, needle", [
    (["--tokenizer-special-tokens", "<unk>", "<s>"], "lacks </s> <mask> <pad> <cls> <sep>"),
    (["--tokenizer-special-tokens", *SPECIAL, "<s>"], "a token is given twice"),
    (["--tiktoken-num-special-tokens", "6"], "--tiktoken-num-special-tokens must be >= 7 "
                                             "(got 6)"),
    (["--tiktoken-num-special-tokens", "8", "--tokenizer-special-tokens", *SPECIAL, "<a>",
      "<b>"], "--tiktoken-num-special-tokens 8 must be at least the 9 special tokens"),
    (["--vocab-size", "100", "--tiktoken-num-special-tokens", "100"],
     "below the vocabulary, --vocab-size 100"),
    (["--tokenizer-special-tokens", *SPECIAL, "--tiktoken-special-tokens", *SPECIAL[:6], "<x>"],
     "differ: give --tokenizer-special-tokens only"),
])
def test_bad_tiktoken_values_are_refused_in_one_line(vocab_json, flags, needle):
    message = _refusal("--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab_json),
                       *flags)
    assert needle in message, message


def test_bad_pattern_is_refused_naming_the_choices(vocab_json):
    with pytest.raises(ArgumentValidationError, match="'v1', 'v2'"):
        _parse("--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab_json),
               "--tiktoken-pattern", "v3")


def test_the_flag_layer_imports_neither_megatron_core_nor_the_packages():
    import subprocess

    probe = ("import sys; from megatron.varlen_training import arguments, hybrid_arguments; "
             "print(sorted(m for m in ('megatron.core', 'sentencepiece', 'tiktoken') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout


# --- export (--save-hf, tools/export_hf.py) -------------------------------------------------

# what config_from_model needs for a Llama-style export
EXPORTABLE = ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
              "--position-embedding-type", "rope", "--train-iters", "1"]


def _model_file_flags(kind: str, model) -> list[str]:
    flags = ["--tokenizer-type", kind, "--tokenizer-model", str(model)]
    if kind == "TikTokenizer":
        flags += ["--vocab-size", str(_full_vocab()), "--tiktoken-num-special-tokens",
                  str(NUM_SPECIAL)]
    return flags


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "TikTokenizer"])
def test_export_config_has_the_models_own_special_ids(spm, processor, vocab_json, kind):
    """config.json's bos/eos/pad ids: the SentencePiece model's (no pad piece: no pad), or
    TikToken's <s>, </s>, <pad>."""
    from megatron.varlen_training.hf.exporter import export_config

    model = vocab_json if kind == "TikTokenizer" else spm
    run = parse_run_config(TINY_ARGS_NO_VOCAB + EXPORTABLE + _model_file_flags(kind, model),
                           world_size=1)
    vocab = _full_vocab() if kind == "TikTokenizer" else processor.get_piece_size()
    config = export_config(run.with_vocabulary(vocab))
    expected = (SPECIAL.index("<s>"), EOS, PAD) if kind == "TikTokenizer" else \
        (processor.bos_id(), processor.eos_id(), None)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == expected


def export_tool_vocabulary_on_this_rank(flags: list[str]) -> tuple[int, int]:
    import dataclasses

    from megatron.varlen_training.hf.export_tool import with_tokenizer_vocabulary

    run = parse_run_config(TINY_ARGS_NO_VOCAB + EXPORTABLE + flags, world_size=1)
    if "--vocab-size" not in flags:  # the vocabulary unresolved, as the flags leave it
        run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=None))
    model = with_tokenizer_vocabulary(run).model
    return model.vocab_size, model.padded_vocab_size


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "TikTokenizer"])
def test_export_tool_sizes_the_vocabulary_as_training(spm, processor, vocab_json, kind):
    """tools/export_hf.py builds the run's tokenizer as training does: the SentencePiece
    model's size; TikTokenizer's --tiktoken-num-special-tokens reaching it (with Megatron-LM's
    1000 the tiny vocabulary would be refused)."""
    from tests.harness.multirank import run_distributed

    model = vocab_json if kind == "TikTokenizer" else spm
    [(vocab, padded)] = run_distributed(export_tool_vocabulary_on_this_rank, 1,
                                        args=(_model_file_flags(kind, model),), timeout_s=120)
    expected = _full_vocab() if kind == "TikTokenizer" else processor.get_piece_size()
    divisible_by = int(TINY_GPT_ARGS[TINY_GPT_ARGS.index("--make-vocab-size-divisible-by") + 1])
    assert (vocab, padded) == (expected, -(-expected // divisible_by) * divisible_by)


# --- entry points ---------------------------------------------------------------------------

def test_pretrain_mamba_takes_the_types_alike(spm, vocab_json):
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config

    hybrid = ["--hybrid-override-pattern", "M*", "--mamba-head-dim", "8",
              "--mamba-num-groups", "2", "--train-iters", "1"]
    run = parse_hybrid_run_config(TINY_ARGS_NO_VOCAB + hybrid + _model_file_flags(
        "TikTokenizer", vocab_json) + ["--tiktoken-pattern", "v1"])
    assert (run.data.tokenizer_model, run.data.tiktoken_pattern) == (str(vocab_json), "v1")
    assert run.data.tiktoken_num_special_tokens == NUM_SPECIAL
    run = parse_hybrid_run_config(TINY_ARGS_NO_VOCAB + hybrid + _model_file_flags(
        "GPTSentencePieceTokenizer", spm))
    assert run.data.tokenizer_model == str(spm)


def test_pretrain_gpt_exits_2_with_one_line_for_a_bad_model_file(vocab_json):
    """A file the flags cannot judge (too few ranks for --vocab-size) is found when the
    tokenizer is built at start-up: one line, exit code 2, no traceback."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "pretrain_gpt.py", *TINY_ARGS_NO_VOCAB, "--train-iters", "1",
         "--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab_json),
         "--vocab-size", "5000", "--tiktoken-num-special-tokens", str(NUM_SPECIAL)],
        cwd=repo, capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if "ranks but the vocabulary" in line]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
