"""SFT from Parquet/Arrow (``--sft --data-path`` a .parquet file, a folder of shards, a
datasets.save_to_disk folder or one of its .arrow files) gives the datasets JSONL gives for the
same conversations, sample for sample; rows are tokenized only when read; bad columns and rows
are one line naming the row or column and the flag. The training runs are in
test_sft_arrow_training.py."""

import builtins
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets import builder, sft_arrow
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import UserInputError, agree_on_errors
from megatron.varlen_training.tokenizer import ByteLevelTokenizer
from tests.harness.extras import require_extra
from tests.unit_tests.varlen_training.datasets.sft_files import (
    conversations, write_all_forms, write_jsonl, write_parquet, write_saved_dataset, write_shards,
)

require_extra("data")  # the whole module skips before its imports of datasets and pyarrow

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

NUM_CHATS = 40
FORMS = ("parquet", "shards", "save_to_disk")


@pytest.fixture(autouse=True)
def arrow_cache(tmp_path, monkeypatch):
    """datasets' Parquet -> Arrow cache in the test's folder, not the user's."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _run(data_path: str, *extra: str):
    return parse_run_config(
        ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
         "--seq-length", "64", "--lr", "1e-3", "--train-iters", "6", "--global-batch-size", "8",
         "--micro-batch-size", "1", "--eval-iters", "1", "--eval-interval", "3", "--sft",
         "--data-path", data_path, "--tokenizer-type", "ByteLevelTokenizer", *extra],
        world_size=1)


def _datasets(data_path: str, *extra: str):
    return build_datasets(_run(data_path, *extra), ByteLevelTokenizer())


def _assert_same_samples(got, want) -> None:
    assert len(got) == len(want)
    for index in range(len(want)):
        a, b = got[index], want[index]
        assert a.keys() == b.keys()
        for key, value in b.items():
            same = torch.equal(a[key], value) if torch.is_tensor(value) else a[key] == value
            assert same, f"sample {index}, {key}"


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    return write_all_forms(conversations(NUM_CHATS), tmp_path_factory.mktemp("forms"))


def test_one_arrow_file_of_a_saved_dataset(forms):
    """A save_to_disk folder's .arrow file alone is read like the folder."""
    (arrow_file,) = sorted(Path(forms["save_to_disk"]).glob("*.arrow"))
    want, _ = _datasets(forms["jsonl"], "--sequence-packing")
    got, _ = _datasets(str(arrow_file), "--sequence-packing")
    _assert_same_samples(got, want)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("packing", [[], ["--sequence-packing"]])
def test_same_train_and_validation_samples_as_jsonl(forms, form, packing):
    want_train, want_valid = _datasets(forms["jsonl"], *packing)
    got_train, got_valid = _datasets(forms[form], *packing)
    assert isinstance(got_train._dataset, sft_arrow.ArrowSFTDataset)
    _assert_same_samples(got_train, want_train)  # 48 reads: more than one epoch, reshuffled
    _assert_same_samples(got_valid, want_valid)


def test_some_samples_are_truncated(forms):
    """The comparison covers truncation: some chats are longer than --seq-length 64."""
    train, _ = _datasets(forms["parquet"], "--sequence-packing")
    assert any(train[i]["length"] == 64 for i in range(len(train)))


def test_prompt_response_columns_under_other_names(tmp_path):
    pairs = [{"question": chat["messages"][-2]["content"], "answer": chat["messages"][-1][
        "content"], "unused": i} for i, chat in enumerate(conversations(12, seed=3))]
    keys = ["--sft-prompt-key", "question", "--sft-response-key", "answer"]
    want, _ = _datasets(write_jsonl(pairs, tmp_path / "pairs.jsonl"), *keys)
    got, _ = _datasets(write_parquet(pairs, tmp_path / "pairs.parquet"), *keys)
    _assert_same_samples(got, want)


def test_rows_are_tokenized_when_read_not_before(forms, monkeypatch):
    """Lazy: opening memory-maps the Arrow data and tokenizes nothing; a read tokenizes one
    row (the JSONL reader tokenizes every line up front)."""
    calls = []
    real = sft_arrow.encode_record
    monkeypatch.setattr(sft_arrow, "encode_record",
                        lambda *args: calls.append(args[-1]) or real(*args))
    dataset = sft_arrow.ArrowSFTDataset(forms["parquet"], ByteLevelTokenizer(), 64)
    assert calls == [] and len(dataset) == NUM_CHATS
    assert isinstance(dataset._rows.data, datasets.table.MemoryMappedTable)
    dataset[7]
    assert calls == [f"{forms['parquet']} row 7"]


def _one_line_error(data_path: str, *extra: str) -> str:
    run = _run(data_path, *extra)
    with pytest.raises(UserInputError) as err:
        agree_on_errors(build_datasets, run, ByteLevelTokenizer())
    assert "\n" not in str(err.value)
    return str(err.value)


def _chat(*turns):
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


GOOD = _chat(("user", "q"), ("assistant", "a"))


def _weighted(user_weight, assistant_weight) -> dict:
    """A chat whose messages carry OpenAI's per-message ``weight``."""
    return {"messages": [{"role": "user", "content": "q", "weight": user_weight},
                         {"role": "assistant", "content": "a", "weight": assistant_weight}]}


@pytest.mark.parametrize("rows, needle", [
    ([GOOD, GOOD, _chat(("user", "q"), ("bot", "a"))],
     "bad.parquet row 2: turn 1 has role 'bot'; expected one of system, user, assistant"),
    ([GOOD, {"messages": [{"role": "user", "content": None}]}],
     "bad.parquet row 1: turn 0 content must be a string, got NoneType"),
    ([GOOD, {"messages": []}], "bad.parquet row 1: 'messages' must be a non-empty list"),
    ([GOOD, {"messages": None}], "bad.parquet row 1: 'messages' must be a non-empty list"),
    ([GOOD, {"messages": [None, {"role": "user", "content": "x"}]}],
     "bad.parquet row 1: message 0 is not an object"),
    ([{"text": "a"}], "no column 'messages' (--sft-messages-key) nor both 'prompt' "
                      "(--sft-prompt-key) and 'response' (--sft-response-key); its columns "
                      "are text"),
    ([{"messages": "hi"}], "column 'messages' (--sft-messages-key) has type string; expected "
                           "a list of {role: string, content: string} messages"),
    ([{"messages": [{"role": "user", "text": "hi"}]}], "column 'messages' (--sft-messages-key)"),
    ([{"prompt": "p", "response": 3}],
     "column 'response' (--sft-response-key) has type int64; expected string"),
    ([{"prompt": None, "response": "r"}, {"prompt": "p", "response": "r"}],
     "bad.parquet row 0: turn 0 content must be a string, got NoneType"),
    ([{**GOOD, "labels": [1, 2]}], "bad.parquet: column 'labels' (pre-tokenised or pre-masked "
                                   "data) would be ignored: --sft tokenizes the conversation"),
    ([{"prompt": "p", "response": "r", "input_ids": [1, 2], "loss_mask": None}],
     "bad.parquet: column 'input_ids'"),
    ([GOOD, _weighted(0, 1), _weighted(None, 0)],
     "bad.parquet row 2: message 1 (assistant) has weight 0, but --sft trains every assistant "
     "turn and no other"),
    ([_weighted(None, 1), _weighted(1.0, 1)], "bad.parquet row 1: message 0 (user) has weight "
                                              "1.0"),
    ([_weighted(None, "1")], "bad.parquet row 0: message 1 (assistant) has weight '1'"),
    ([GOOD, _chat(("system", "s"), ("user", "q"), ("assistant", "a")), GOOD,
      _chat(("user", "q"), ("assistant", "a"), ("system", "t"), ("user", "r"))],
     "bad.parquet row 3: turn 2 is a system message after the conversation's start"),
    ([GOOD, {"messages": [{"role": "user", "content": "q", "tool_calls": None},
                          {"role": "assistant", "content": "", "tool_calls": [{"f": "g"}]}]}],
     "bad.parquet row 1: message 1 has 'tool_calls', which --sft does not pass"),
])
def test_bad_rows_and_columns_are_one_line(tmp_path, rows, needle):
    path = write_parquet(rows, tmp_path / "bad.parquet")
    assert needle in _one_line_error(path), _one_line_error(path)


def test_bad_row_found_in_a_later_check_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(sft_arrow, "CHECK_BATCH_ROWS", 4)
    rows = [GOOD] * 9 + [_chat(("user", "q"), ("robot", "a"))]
    assert "bad.parquet row 9: turn 1 has role 'robot'" in _one_line_error(
        write_parquet(rows, tmp_path / "bad.parquet"))


def test_empty_folder_dataset_dict_no_rows_and_no_parquet_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "is a directory with neither .parquet shards nor a datasets.save_to_disk" in \
        _one_line_error(str(tmp_path / "empty"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list([GOOD])}).save_to_disk(
        str(tmp_path / "dict"))
    assert "holds a DatasetDict (splits: train); point --data-path at one split's folder" in \
        _one_line_error(str(tmp_path / "dict"))
    pq.write_table(pa.Table.from_pylist([GOOD]).slice(0, 0), tmp_path / "none.parquet")
    assert "has no samples (--data-path)" in _one_line_error(str(tmp_path / "none.parquet"))
    assert "does not exist (--data-path)" in _one_line_error(str(tmp_path / "gone.parquet"))
    (tmp_path / "text.parquet").write_text("not parquet")
    assert "text.parquet is not a readable Parquet file" in _one_line_error(
        str(tmp_path / "text.parquet"))
    (tmp_path / "text.arrow").write_text("not arrow")
    assert "text.arrow is not a readable Arrow file" in _one_line_error(
        str(tmp_path / "text.arrow"))


def test_shards_that_disagree_are_one_line(tmp_path):
    (tmp_path / "shards").mkdir()
    write_parquet([GOOD], tmp_path / "shards" / "a.parquet")
    named = {"messages": [{"role": "user", "content": "q", "name": "n"}]}
    write_parquet([named], tmp_path / "shards" / "b.parquet")
    assert "datasets cannot read the Parquet shards as one table (Couldn't cast" in \
        _one_line_error(str(tmp_path / "shards"))


def test_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    path = write_parquet([GOOD], tmp_path / "chats.parquet")
    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    assert "needs the 'data' extra: pip install -e '.[data]'" in _one_line_error(path)


def test_dispatch_reads_jsonl_as_before(forms):
    train, _ = _datasets(forms["jsonl"])
    assert type(train._dataset).__name__ == "SFTDataset"
    assert builder.open_sft_data.__doc__  # the one place the formats are told apart


def test_metadata_null_columns_and_agreeing_weights_give_the_jsonl_samples(tmp_path):
    """Columns that are metadata (id, source, a prompt beside the messages, a token count
    under 'tokens'), pre-tokenised columns of null type, empty tool calls and reasoning and
    weights that agree with the mask are not refused, and the rows
    give the samples the plain conversations give as JSONL."""
    chats = conversations(6, seed=3)
    rows = [{"id": i, "source": "web", "prompt": "unrelated", "labels": None, "tokens": 40 + i,
             "messages": [{**m, "weight": int(m["role"] == "assistant"), "tool_calls": [],
                           "reasoning_content": ""} for m in chat["messages"]]}
            for i, chat in enumerate(chats)]
    parquet = write_parquet(rows, tmp_path / "meta.parquet")
    plain = write_jsonl(chats, tmp_path / "plain.jsonl")
    for got, want in zip(_datasets(parquet), _datasets(plain)):
        _assert_same_samples(got, want)


def test_rows_without_an_assistant_turn_are_counted_and_warned_about(tmp_path, monkeypatch,
                                                                     capsys):
    """Counting by hand: 3 of 9 rows have no assistant turn (user-only, system + user), spread
    over several check batches (rows with two assistant turns count once among the others);
    their samples have no trained label, as the count says."""
    monkeypatch.setattr(sft_arrow, "CHECK_BATCH_ROWS", 4)
    no_answer = [_chat(("user", "q")), _chat(("system", "s"), ("user", "q")),
                 _chat(("user", "q"), ("user", "again"))]
    two_answers = _chat(("user", "q"), ("assistant", "a"), ("user", "r"), ("assistant", "b"))
    rows = [GOOD, no_answer[0], two_answers, GOOD, GOOD, no_answer[1], GOOD, two_answers,
            no_answer[2]]
    dataset = sft_arrow.ArrowSFTDataset(write_parquet(rows, tmp_path / "chats.parquet"),
                                        ByteLevelTokenizer(), 64)
    assert dataset.num_without_assistant == 3
    assert [i for i in range(len(rows)) if dataset[i]["num_loss_tokens"] == 0] == [1, 5, 8]
    assert "3 of 9 rows in" in capsys.readouterr().out
    pairs = write_parquet([{"prompt": "p", "response": "r"}] * 3, tmp_path / "pairs.parquet")
    assert sft_arrow.ArrowSFTDataset(pairs, ByteLevelTokenizer(), 64).num_without_assistant == 0


@pytest.mark.parametrize("form", ["save_to_disk", "arrow_file", "shards"])
def test_pretokenized_column_refused_in_every_form(tmp_path, form):
    """A ``labels`` column (what a Hugging Face SFT pipeline writes beside its messages) is
    refused in a save_to_disk folder, one of its Arrow files and Parquet shards alike."""
    rows = [{**GOOD, "labels": [-100, 97]}] * 6
    if form == "shards":
        path = write_shards(rows, tmp_path / "shards")
    else:
        path = write_saved_dataset(rows, tmp_path / "saved")
        if form == "arrow_file":
            path = str(next(Path(path).glob("*.arrow")))
    assert "column 'labels' (pre-tokenised or pre-masked data) would be ignored" in \
        _one_line_error(path)
