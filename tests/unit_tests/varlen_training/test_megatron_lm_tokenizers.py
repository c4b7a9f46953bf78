"""Megatron-LM's classic --tokenizer-type values: GPT2BPETokenizer from --vocab-file/--merge-file
(ids against transformers' GPT2Tokenizer over the same files and against an independent GPT-2
BPE written from the algorithm, eod and padded vocabulary as Megatron-LM's), and the one-line
refusals of the types and tokenizer flags this fork does not honour."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.tokenizer import build_tokenizer
from megatron.varlen_training.tokenizer_arguments import REFUSED_FLAGS
from tests.harness.extras import needs_extra
from tests.harness.training_runs import TINY_GPT_ARGS

regex = pytest.importorskip("regex")  # the reference's pre-tokenizer (a transformers dependency)
from tests.unit_tests.varlen_training.gpt2_files import (  # noqa: E402
    EOD_TOKEN, reference_ids, write_gpt2_files,
)

pytestmark = needs_extra("hf")
REPO = Path(__file__).resolve().parents[3]
TEXTS = [
    "",
    "hello world",
    "hello  world\n\nthe cafe caf\u00e9 12 123 -- in a\u00e9",
    "  leading spaces, trailing   ",
    f"one{EOD_TOKEN}two {EOD_TOKEN} three",
    "\u6f22\u5b57 \U0001F600 \t tabs\r\nand 'll 's 've",
    "hellohello worldworld",
]
GPT2_VOCAB, GPT2_PADDED = 50257, 50304  # GPT-2's vocabulary; Megatron-LM's log pads it to this
_AT = TINY_GPT_ARGS.index("--vocab-size")
TINY_ARGS_NO_VOCAB = TINY_GPT_ARGS[:_AT] + TINY_GPT_ARGS[_AT + 2:]  # the tokenizer sizes it


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    return write_gpt2_files(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def tokenizer(files):
    vocab_file, merge_file = files
    return build_tokenizer("GPT2BPETokenizer", vocab_file=str(vocab_file),
                           merge_file=str(merge_file))


@pytest.fixture(scope="module")
def transformers_gpt2(files, tmp_path_factory):
    """transformers' GPT2Tokenizer over the same two files (its own file names in a folder)."""
    from transformers import GPT2Tokenizer

    folder = tmp_path_factory.mktemp("hf_gpt2")
    shutil.copy(files[0], folder / "vocab.json")
    shutil.copy(files[1], folder / "merges.txt")
    return GPT2Tokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers_gpt2_and_the_reference_bpe(tokenizer, transformers_gpt2, text):
    ids = tokenizer.tokenize(text)
    assert ids == transformers_gpt2.encode(text, add_special_tokens=False)
    assert ids == reference_ids(text)
    # what tools/preprocess_data.py writes (megatron-core's include_special_tokens default):
    # GPT-2 adds no BOS, so the same ids
    assert tokenizer.text_to_ids(text, include_special_tokens=True) == ids
    assert tokenizer.detokenize(ids) == text


def test_eod_and_vocabulary_are_megatron_lms(tokenizer, files):
    vocab = json.loads(files[0].read_text(encoding="utf-8"))
    assert tokenizer.vocab_size == len(vocab)  # the file's entries
    assert tokenizer.eod == vocab[EOD_TOKEN] == tokenizer.pad


@pytest.mark.parametrize("divisible_by, tp", [(128, 1), (128, 2), (7, 1)])
def test_padded_vocabulary_as_megatron_lm_computes_it(files, tokenizer, divisible_by, tp):
    vocab_file, merge_file = files
    run = parse_run_config(
        TINY_ARGS_NO_VOCAB + ["--train-iters", "1", "--tokenizer-type", "GPT2BPETokenizer",
                         "--vocab-file", str(vocab_file), "--merge-file", str(merge_file),
                         "--make-vocab-size-divisible-by", str(divisible_by),
                         "--tensor-model-parallel-size", str(tp)], world_size=tp)
    model = run.with_vocabulary(tokenizer.vocab_size).model
    multiple = divisible_by * tp
    padded = tokenizer.vocab_size
    while padded % multiple:  # Megatron-LM's loop: one dummy token at a time
        padded += 1
    assert (model.vocab_size, model.padded_vocab_size) == (tokenizer.vocab_size, padded)
    assert run.data.vocab_file == str(vocab_file) and run.data.merge_file == str(merge_file)


def test_gpt2s_own_sizes_pad_as_in_megatron_lms_log():
    from megatron.varlen_training.run_description import padded_vocab_size

    assert padded_vocab_size(GPT2_VOCAB, 128, 1) == GPT2_PADDED


def _parse(*flags: str):
    return parse_args(TINY_GPT_ARGS + ["--train-iters", "1", *flags], world_size=1)


def _refusal(*flags: str) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        _parse(*flags)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("missing", ["--vocab-file", "--merge-file"])
def test_gpt2_bpe_needs_both_files(files, missing):
    given = {"--vocab-file": str(files[0]), "--merge-file": str(files[1])}
    given.pop(missing)
    flags = [word for pair in given.items() for word in pair]
    message = _refusal("--tokenizer-type", "GPT2BPETokenizer", *flags)
    assert missing in message and "GPT2BPETokenizer" in message


def test_tokenizer_model_beside_gpt2_bpe_is_refused(files):
    message = _refusal("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(files[0]),
                       "--merge-file", str(files[1]), "--tokenizer-model", "some/dir")
    assert "--tokenizer-model 'some/dir'" in message


def test_files_without_gpt2_bpe_are_refused(files):
    message = _refusal("--vocab-file", str(files[0]))  # TINY_GPT_ARGS: NullTokenizer
    assert "--vocab-file" in message and "NullTokenizer" in message


@pytest.mark.parametrize("kind, package", [
    ("SentencePieceTokenizer", "sentencepiece"), ("GPTSentencePieceTokenizer", "sentencepiece"),
    ("Llama2Tokenizer", "sentencepiece"), ("TikTokenizer", "tiktoken")])
def test_types_needing_a_package_are_refused_naming_it_without_it(monkeypatch, kind, package):
    """Where the package is missing (the [tokenizers] extra not installed): one line naming
    it and pip install, at parse time and when built (test_model_file_tokenizers.py tests the
    types with it)."""
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    message = _refusal("--tokenizer-type", kind, "--tokenizer-model", "tok.model")
    assert kind in message and f"pip install {package}" in message
    with pytest.raises(ValueError, match=f"pip install {package}"):
        build_tokenizer(kind, tokenizer_model="tok.model")


@pytest.mark.parametrize("kind", ["BertWordPieceLowerCase", "BertWordPieceCase",
                                  "MultimodalTokenizer", "NullMultimodalTokenizer",
                                  "SFTTokenizer"])
def test_types_of_other_model_families_are_refused_with_what_to_use(kind):
    message = _refusal("--tokenizer-type", kind)
    assert kind in message and message.count("--tokenizer-type") == 2  # and what to use


@pytest.mark.parametrize("row", REFUSED_FLAGS, ids=lambda row: row.flag)
def test_megatron_lm_tokenizer_flags_not_honoured_are_refused(row):
    value = [] if row.kwargs.get("action") == "store_true" else ["17"]
    assert row.flag in _refusal(row.flag, *value)


def test_megatron_lm_defaults_of_refused_flags_change_nothing():
    _parse("--vocab-extra-ids", "0", "--tiktoken-num-special-tokens", "1000",
           "--null-tokenizer-pad-id", "-1")


def test_build_tokenizer_refuses_in_one_line(files):
    with pytest.raises(ValueError, match="no '<\\|endoftext\\|>' entry"):
        bad = files[0].parent / "no-eod.json"
        bad.write_text(json.dumps({"a": 0}), encoding="utf-8")
        build_tokenizer("GPT2BPETokenizer", vocab_file=str(bad), merge_file=str(files[1]))
    with pytest.raises(ValueError, match="not supported"):
        build_tokenizer("BertWordPieceCase")


def test_pretrain_gpt_exits_2_with_one_line():
    """The entry point itself: exit code 2 and the refusal printed once, no traceback."""
    result = subprocess.run(
        [sys.executable, "pretrain_gpt.py", *TINY_GPT_ARGS, "--train-iters", "1",
         "--tokenizer-type", "Llama2Tokenizer"],  # without its --tokenizer-model
        cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if "Llama2Tokenizer" in line]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]


def test_pretrain_mamba_takes_the_files_and_refuses_alike(files, tokenizer):
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config

    hybrid = ["--hybrid-override-pattern", "M*", "--mamba-head-dim", "8",
              "--mamba-num-groups", "2", "--train-iters", "1"]
    run = parse_hybrid_run_config(
        TINY_ARGS_NO_VOCAB + hybrid + ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                                       str(files[0]), "--merge-file", str(files[1])])
    assert (run.data.vocab_file, run.data.merge_file) == (str(files[0]), str(files[1]))
    assert run.with_vocabulary(tokenizer.vocab_size).model.vocab_size == tokenizer.vocab_size
    with pytest.raises(ArgumentValidationError, match="Llama2Tokenizer needs --tokenizer-model"):
        parse_hybrid_run_config(TINY_GPT_ARGS + hybrid + ["--tokenizer-type", "Llama2Tokenizer"])


@pytest.mark.parametrize("vocab, merges, needle", [
    ('{"a": 0, "<|endoftext|>": 2}', "", "not 0..1"),
    ('["a"]', "", "not a JSON object"),
    ("{not json", "", "not a readable vocabulary JSON"),
    (None, "", "No such file"),
    ('{"a": 0, "b": 1, "<|endoftext|>": 2}', "#version: 0.2\na b c\n", "line 2 'a b c'"),
    ('{"a": 0, "b": 1, "<|endoftext|>": 2}', "a x\n", "merges 'x'"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path, vocab, merges, needle):
    vocab_file, merge_file = tmp_path / "v.json", tmp_path / "m.txt"
    if vocab is not None:
        vocab_file.write_text(vocab, encoding="utf-8")
    merge_file.write_text(merges, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        build_tokenizer("GPT2BPETokenizer", vocab_file=str(vocab_file), merge_file=str(merge_file))
    message = str(err.value)
    assert "\n" not in message and needle in message, message


def test_config_values_take_the_files_and_megatron_lm_defaults(files):
    """The facade's path (flag values as data, flag_values.py): Megatron-LM's defaults of the
    refused flags, as a megatron-wrap config carries them, change nothing; other values are
    refused naming the flag."""
    from megatron.varlen_training.flag_values import parse_values

    base = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32,
            "micro_batch_size": 2, "global_batch_size": 4, "lr": 1e-3, "mock_data": True,
            "train_iters": 1, "tokenizer_type": "GPT2BPETokenizer",
            "vocab_file": str(files[0]), "merge_file": str(files[1])}
    defaults = {"vocab_extra_ids": 0, "tiktoken_num_special_tokens": 1000,
                "null_tokenizer_pad_id": -1, "tokenizer_hf_no_use_fast": False,
                "trust_remote_code": False, "legacy_tokenizer": False, "chat_template": None}
    args = parse_values({**base, **defaults}, world_size=1)
    assert (args.vocab_file, args.merge_file) == (str(files[0]), str(files[1]))
    with pytest.raises(ArgumentValidationError, match="--vocab-extra-ids 100"):
        parse_values({**base, "vocab_extra_ids": 100}, world_size=1)
    with pytest.raises(ArgumentValidationError, match="--trust-remote-code"):
        parse_values({**base, "trust_remote_code": True}, world_size=1)
