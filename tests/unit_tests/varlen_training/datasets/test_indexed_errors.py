"""Bad indexed data is one line naming the prefix or flag, the value and the fix; never a
traceback or a hang in megatron-core's builder (the checks run before it, on every rank)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config import DataConfig
from megatron.varlen_training.data_arguments import parse_blend, parse_split
from megatron.varlen_training.datasets.indexed import (
    check_indexed_data, gpt_dataset_config, split_sizes,
)
from megatron.varlen_training.datasets.indexed_checks import split_that_fills
from megatron.varlen_training.tokenizer import ByteLevelTokenizer
from tests.unit_tests.varlen_training.datasets.indexed_corpus import (
    random_documents, write_corpus, write_documents,
)

REPO = Path(__file__).resolve().parents[4]
BASE = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
        "--tokenizer-type", "ByteLevelTokenizer"]


@pytest.mark.parametrize("entries, needle", [
    (["0.5", "a", "b"], "--data-path: 3 entries, but a weighted blend is pairs 'WEIGHT PREFIX' "
                        "(entry 1 '0.5' is a weight)"),
    (["0.5", "a", "b", "c"], "--data-path: entry 3 'b' is not a weight"),
    (["-1", "a", "2", "b"], "--data-path: entry 1 '-1' is not a weight"),
    (["nan", "a", "1", "b"], "--data-path: entry 1 'nan' is not a weight"),
    (["0", "a", "0", "b"], "--data-path: entry 1 gives 'a' a weight of 0, but megatron-core "
                           "blends only datasets with weights > 0: leave it out of --data-path"),
    # one zero weight among positive ones: megatron-core's BlendedDataset asserted (traceback)
    (["0.5", "a", "0", "b"], "--data-path: entry 3 gives 'b' a weight of 0"),
])
def test_blend_that_does_not_parse_names_the_entry(entries, needle):
    with pytest.raises(ValueError) as err:
        parse_blend(entries, "--data-path")
    assert str(err.value).startswith(needle), err.value


def test_megatron_core_refuses_a_zero_weight():
    """The fact the zero-weight refusal rests on: megatron-core's BlendedDataset asserts every
    weight > 0 before it looks at anything else of its datasets."""
    from types import SimpleNamespace

    from megatron.core.datasets.blended_dataset import BlendedDataset

    same_split = SimpleNamespace(index_split=0)
    with pytest.raises(AssertionError):
        BlendedDataset([same_split, same_split], [0.5, 0.0], 8, None)


@pytest.mark.parametrize("entries, needle", [
    (["0.5", "a", "0.5", "a"], "--data-path: entry 4 'a' names the dataset of entry 2 again: "
                               "megatron-core would build it twice with the same sample order "
                               "and read its first samples twice each; name it once with the "
                               "weights summed (1)"),
    (["0.2", "a", "0.3", "b", "0.4", "./a"], "entry 6 './a' names the dataset of entry 2 "
                                             "again: "),
    (["a", "b", "a"], "--data-path: entry 3 'a' names the dataset of entry 1 again: "),
])
def test_a_dataset_named_twice_in_a_blend_is_refused(entries, needle):
    """Why: test_indexed.py::test_megatron_core_reads_a_repeated_prefix_twice."""
    with pytest.raises(ValueError) as err:
        parse_blend(entries, "--data-path")
    assert needle in str(err.value), err.value
    assert str(err.value).endswith("name it once") or "weights summed" in str(err.value)


def test_the_same_dataset_in_two_splits_is_not_a_repeat():
    args = parse_args(BASE + ["--train-data-path", "a", "--valid-data-path", "a"], world_size=1)
    assert args.train_data_path == args.valid_data_path == ["a"]
    with pytest.raises(ArgumentValidationError, match="--valid-data-path: entry 2 'a' names"):
        parse_args(BASE + ["--train-data-path", "a", "--valid-data-path", "a", "a"],
                   world_size=1)


def test_blends_that_parse():
    assert parse_blend(["a"], "--data-path") == (["a"], None)
    assert parse_blend(["a", "b"], "--data-path") == (["a", "b"], None)
    assert parse_blend(["0.7", "a", "0.3", "b"], "--data-path") == (["a", "b"], [0.7, 0.3])


@pytest.mark.parametrize("split", ["x", "1,2,3,4", "0,0,0", "-1,2", "90,inf"])
def test_bad_split_is_refused(split):
    with pytest.raises(ValueError, match=f"--split '{split}'"):
        parse_split(split)


def test_flag_layer_refuses_bad_blends_and_mixed_sources():
    with pytest.raises(ArgumentValidationError, match="entry 3 'b' is not a weight"):
        parse_args(BASE + ["--data-path", "1", "a", "b", "c"], world_size=1)
    with pytest.raises(ArgumentValidationError, match="are alternatives"):
        parse_args(BASE + ["--data-path", "a", "--train-data-path", "b"], world_size=1)
    with pytest.raises(ArgumentValidationError, match="no training data: pass --mock-data, "
                                                      "--data-path or --train-data-path"):
        parse_args(BASE + ["--valid-data-path", "b"], world_size=1)
    args = parse_args(BASE + ["--data-path", "a"], world_size=1)
    assert args.split == "969, 30, 1"  # Megatron-LM's legacy default


def _run_checks(tmp_path, data_path, split="90,10,0", vocab_tokenizer=None, **data) -> None:
    """check_indexed_data on a DataConfig of these values (the rest: a small byte-level run)."""
    values = dict(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                  tokenizer_type="ByteLevelTokenizer", tokenizer_model=None, train_samples=8,
                  eval_samples=4, split=split,
                  data_path=None if data_path is None else tuple(data_path),
                  sft_messages_key="messages", sft_prompt_key="prompt",
                  sft_response_key="response",
                  data_cache_path=str(tmp_path / "cache"))
    values.update(data)
    config = DataConfig(**values)
    core = gpt_dataset_config(config, 32, 1, vocab_tokenizer or ByteLevelTokenizer())
    check_indexed_data(core, config, split_sizes(config, core))


def _check(tmp_path, data_path, split="90,10,0", vocab_tokenizer=None, **data):
    """The one-line refusal of these values."""
    with pytest.raises(ValueError) as err:
        _run_checks(tmp_path, data_path, split, vocab_tokenizer, **data)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.fixture
def prefix(tmp_path):
    write_corpus(str(tmp_path / "docs"), 40, seed=1)
    return str(tmp_path / "docs")


def test_missing_bin_names_the_prefix(tmp_path, prefix):
    os.remove(prefix + ".bin")
    assert _check(tmp_path, [prefix]) == (
        f"--data-path: indexed dataset {prefix!r} has no docs.bin ({prefix}.bin does not "
        f"exist); a dataset is the pair PREFIX.bin + PREFIX.idx that tools/preprocess_data.py "
        f"writes")


def test_file_name_instead_of_prefix(tmp_path, prefix):
    assert _check(tmp_path, [prefix + ".idx"]).startswith(
        f"--data-path: '{prefix}.idx' is a file name; indexed datasets are named by their "
        f"prefix (pass '{prefix}'")


@pytest.mark.parametrize("name", ["chats.jsonl", "chats.parquet"])
def test_sft_file_without_sft_says_to_add_it(tmp_path, name):
    """An SFT file given without --sft is read as an indexed prefix: the line says what it is."""
    path = tmp_path / name
    path.write_text('{"prompt": "p", "response": "r"}\n')
    assert _check(tmp_path, [str(path)]) == (
        f"--data-path: {str(path)!r} is SFT data, not an indexed dataset prefix: add --sft to "
        f"train on its conversations, or preprocess it with tools/preprocess_data.py")


def test_mismatched_bin_and_idx(tmp_path, prefix):
    write_corpus(str(tmp_path / "other"), 40, seed=2)
    shutil.copy(str(tmp_path / "other.bin"), prefix + ".bin")
    message = _check(tmp_path, [prefix])
    assert message.startswith(f"--data-path: {prefix}.bin has ") and \
        "the .bin and .idx do not belong together" in message, message


def test_truncated_or_foreign_idx(tmp_path, prefix):
    data = Path(prefix + ".idx").read_bytes()
    Path(prefix + ".idx").write_bytes(data[:-8])
    assert "is truncated or damaged" in _check(tmp_path, [prefix])
    Path(prefix + ".idx").write_bytes(b"not an index at all, at least 34 bytes long")
    assert "is not a Megatron index file" in _check(tmp_path, [prefix])


def test_dtype_that_cannot_hold_the_vocabulary(tmp_path):
    small = [doc % 200 for doc in random_documents(20, seed=4)]  # ids fit uint8, eod does not
    write_documents(str(tmp_path / "bytes"), small, dtype=np.uint8)
    assert _check(tmp_path, [str(tmp_path / "bytes")]) == (
        f"--data-path: {tmp_path}/bytes stores token ids as uint8 (at most 255) but the "
        f"tokenizer has 261 ids (--tokenizer-type ByteLevelTokenizer): it was made with another "
        f"tokenizer; preprocess it again with this one")


def test_dtype_refusal_names_the_files_of_a_gpt2_bpe_run(tmp_path):
    """The hint follows the run's --tokenizer-type (DataConfig), not a fixed list: a
    GPT2BPETokenizer run is told about its --vocab-file and --merge-file."""
    small = [doc % 200 for doc in random_documents(20, seed=4)]
    write_documents(str(tmp_path / "bytes"), small, dtype=np.uint8)
    message = _check(tmp_path, [str(tmp_path / "bytes")], tokenizer_type="GPT2BPETokenizer")
    assert "(--tokenizer-type GPT2BPETokenizer, --vocab-file, --merge-file)" in message


def test_empty_split_names_split(tmp_path):
    """10 documents, 3% for validation: none. The suggested split is the nearest in whole
    percents that gives validation a document (round(0.94 x 10) = 9, round(0.98 x 10) = 10),
    and the checks accept it."""
    write_corpus(str(tmp_path / "tiny"), 10, seed=5)
    message = _check(tmp_path, [str(tmp_path / "tiny")], split="969, 30, 1")
    assert message == (
        f"--split '969, 30, 1' leaves the validation split of {tmp_path}/tiny empty (0 of its "
        f"10 documents, 0 tokens): give the validation split a larger share (e.g. --split "
        f"94,4,2) or set --eval-iters 0")
    _run_checks(tmp_path, [str(tmp_path / "tiny")], "94,4,2")


def test_empty_test_split_names_its_fixes(tmp_path):
    """The test split is read at the end of training (as in Megatron-LM): an empty one is
    refused in one line (megatron-core would search it forever), naming the ways out, each
    checked to work for these 10 documents (a fixed 90,5,5 gives the test split none:
    round(9.5) = 10 = round(10.0))."""
    write_corpus(str(tmp_path / "tiny"), 10, seed=5)
    message = _check(tmp_path, [str(tmp_path / "tiny")], split="90,9,1", test_samples=4)
    assert message == (
        f"--split '90,9,1' leaves the test split of {tmp_path}/tiny empty (0 of its 10 "
        f"documents, 0 tokens): give the test split a larger share (e.g. --split 85,9,6) or "
        f"none (e.g. --split 91,9,0: no test evaluation) or set --eval-iters 0")
    _run_checks(tmp_path, [str(tmp_path / "tiny")], "85,9,6", test_samples=4)
    _run_checks(tmp_path, [str(tmp_path / "tiny")], "91,9,0", test_samples=4)


def test_too_few_documents_for_the_splits_read(tmp_path):
    """Two documents cannot feed three splits: no share helps, the message says so."""
    write_corpus(str(tmp_path / "two"), 2, seed=5)
    message = _check(tmp_path, [str(tmp_path / "two")], split="98,1,1", test_samples=4)
    assert "2 documents are too few to give each split that is read one: add documents" \
        in message


def test_a_dataset_without_tokens_is_named(tmp_path, prefix):
    """Documents without a token (an empty .bin, e.g. an empty JSONL preprocessed), where
    megatron-core cannot memory-map the file: one line names the flag and the file."""
    empties = write_documents(str(tmp_path / "empties"), [np.array([], dtype=np.int64)] * 3)
    message = _check(tmp_path, None, split=None, train_data_path=(prefix,),
                     valid_data_path=(empties,))
    assert message == (f"--valid-data-path: {empties}.bin is empty (3 sequences, none with a "
                       f"token): a dataset needs tokens; check the input given to "
                       f"tools/preprocess_data.py")


def _hand_ranges(percents, num_documents):
    """Each split's documents as megatron-core cuts them, written out by hand."""
    ends = [0, percents[0], percents[0] + percents[1], 100]
    return [range(round(ends[i] / 100 * num_documents), round(ends[i + 1] / 100 * num_documents))
            for i in range(3)]


@pytest.mark.parametrize("split, num_documents, needed", [
    ("90,10,0", 4, [0, 1]), ("969,30,1", 10, [0, 1]), ("90,9,1", 10, [0, 1, 2]),
    ("99,1,0", 40, [0, 1]), ("0,1,0", 40, [0, 1]), ("1,1,1", 3, [0, 1, 2]),
])
def test_the_suggested_split_is_the_nearest_that_fills(split, num_documents, needed):
    """Against a brute force over every split in whole percents, cut by hand: the suggestion
    gives each split read a document, and no split nearer the given one (squared change of
    the shares) does."""
    suggested = split_that_fills(split, np.ones(num_documents, dtype=np.int64), needed)
    given = [100 * float(w) / sum(map(float, split.split(","))) for w in split.split(",")]

    def fills(percents):
        return all(len(_hand_ranges(percents, num_documents)[i]) for i in needed)

    def distance(percents):
        return sum((a - b) ** 2 for a, b in zip(percents, given))

    def keeps_unread_unshared(percents):  # a split nobody reads gets no share it lacked
        return all(percents[i] == 0 for i in range(3) if given[i] == 0 and i not in needed)

    best = [int(p) for p in suggested.split(",")]
    assert sum(best) == 100 and fills(best) and keeps_unread_unshared(best)
    nearer = [(a, b, 100 - a - b) for a in range(101) for b in range(101 - a)
              if distance((a, b, 100 - a - b)) < distance(best) - 1e-9]
    assert not any(fills(p) and keeps_unread_unshared(p) for p in nearer)


def test_unwritable_cache(tmp_path, prefix):
    (tmp_path / "a_file").write_text("")
    message = _check(tmp_path, [prefix], data_cache_path=str(tmp_path / "a_file" / "cache"))
    assert message.endswith("is not a writable directory; choose a writable --data-cache-path")


def test_whole_documents_need_no_writable_cache(tmp_path, prefix):
    """--packing-unit document builds no megatron-core GPTDataset, so nothing is written to its
    cache (the data folder's, by default): an unwritable one is no refusal there."""
    (tmp_path / "a_file").write_text("")
    values = dict(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                  tokenizer_type="ByteLevelTokenizer", tokenizer_model=None, train_samples=8,
                  eval_samples=4, split="90,10,0", data_path=(prefix,),
                  sft_messages_key="messages", sft_prompt_key="prompt",
                  sft_response_key="response", packing_unit="document",
                  data_cache_path=str(tmp_path / "a_file" / "cache"))
    config = DataConfig(**values)
    core = gpt_dataset_config(config, 32, 1, ByteLevelTokenizer())
    check_indexed_data(core, config, split_sizes(config, core))


def test_entry_point_prints_one_line_and_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "pretrain_gpt.py", *BASE, "--data-path", str(tmp_path / "missing")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"pretrain_gpt.py: error: --data-path: indexed dataset '{tmp_path}/missing' has no "
        f"missing.idx ({tmp_path}/missing.idx does not exist); a dataset is the pair "
        f"PREFIX.bin + PREFIX.idx that tools/preprocess_data.py writes"]


@pytest.mark.parametrize("split, needle", [
    ("100,0,0", "--split '100,0,0' gives the validation split no share, but --eval-iters asks "
                "for validation: give it a share (e.g. --split 90,10,0) or set --eval-iters 0"),
    ("0,100,0", "--split '0,100,0' gives the training split no share, but training reads it: "
                "give it a share (e.g. --split 90,10,0)"),
])
def test_split_without_a_share_for_a_read_split(tmp_path, prefix, split, needle):
    assert _check(tmp_path, [prefix], split=split) == needle
