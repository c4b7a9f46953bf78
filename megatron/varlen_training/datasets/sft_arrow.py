"""SFT conversations from Parquet or Arrow (``--sft --data-path``), read lazily.

``--data-path`` names a ``.parquet`` file, a folder of ``.parquet`` shards (read in plain name
order, as ``datasets.load_dataset("parquet", data_dir=...)`` and ``pyarrow.dataset`` read a
folder: ``part-10`` before ``part-2`` unless the numbers are zero-padded; the order is logged,
and a warning names shards whose numbers sort otherwise), a folder written by
``datasets.Dataset.save_to_disk`` or one ``.arrow`` file of such a folder; all local. Hugging Face
``datasets`` reads them (the optional ``[data]`` extra: ``datasets`` and ``pyarrow``): Arrow files
are memory-mapped; Parquet is converted once into ``datasets``' Arrow cache (``$HF_DATASETS_CACHE``,
reused by later runs and by the other ranks) and memory-mapped from there. Only the conversation's
columns are read; a column of pre-tokenised data beside them is refused rather than ignored
(``sft_unread``).

Rows are the records of the JSONL format (:mod:`megatron.varlen_training.datasets.sft`), with
the same keys (``--sft-messages-key``, or ``--sft-prompt-key`` and ``--sft-response-key``), the
same template, masking and truncation, so the same conversations give the same samples. A row is
tokenized when it is read, never the whole dataset at once, so truncation is counted as rows are
read: each rank warns at its first truncated row and counts the rows and tokens it cut
(``truncated_rows``); at the end of training ``truncation_report.report_truncated_rows``
prints the count over every rank's reads in one line. Because reads happen during
training, every row is checked at start-up instead, batch by batch with Arrow compute (columns
and their types, empty or null conversations, roles, null texts), and a problem is one line
naming the row and the flag. What only tokenizing shows (a conversation the chat template
rejects, text the tokenizer refuses, a sample under 2 tokens) is one line naming the row when
the row is read.
"""

from __future__ import annotations

import glob
import operator
import os
import re
from contextlib import contextmanager

import numpy as np
import torch

from megatron.varlen_training.datasets.sample import make_sample
from megatron.varlen_training.datasets.sft import (
    SYSTEM_ROLE, SFTKeys, encode_record, parse_turns, truncate,
)
from megatron.varlen_training.datasets.sft_unread import (
    PRETOKENIZED_HINT, UNRENDERED_MESSAGE_KEYS, WEIGHT_KEY, first_pretokenized,
)
from megatron.varlen_training.errors import one_line
from megatron.varlen_training.log import print_rank_0, warning_all_ranks, warning_rank_0
from megatron.varlen_training.tokenizer import CHAT_ROLES, TRAINED_ROLE, Tokenizer

PARQUET_SUFFIX = ".parquet"
ARROW_SUFFIX = ".arrow"  # the files inside a save_to_disk folder
SAVE_TO_DISK_MARKER = "state.json"  # written by Dataset.save_to_disk
DATASET_DICT_MARKER = "dataset_dict.json"  # written by DatasetDict.save_to_disk
CHECK_BATCH_ROWS = 65_536  # rows per Arrow compute batch of the start-up check
EXTRA_HINT = "pip install -e '.[data]' (the datasets and pyarrow packages)"


def is_arrow_source(path: str) -> bool:
    """Whether ``--sft --data-path path`` is Parquet/Arrow (else JSONL): a ``.parquet`` or
    ``.arrow`` file, or a folder (a folder is never JSONL)."""
    return os.path.isdir(path) or path.endswith((PARQUET_SUFFIX, ARROW_SUFFIX))


def _import_datasets():
    try:
        import datasets
        import pyarrow  # noqa: F401 - datasets needs it; named in the message when missing
    except ImportError as err:
        raise ValueError(f"--data-path: reading Parquet/Arrow SFT data needs the 'data' extra: "
                         f"{EXTRA_HINT} ({err})") from err
    return datasets


@contextmanager
def _quiet(datasets):
    """datasets' progress bars off while loading: every rank loads, and a bar per rank and
    shard would bury the log."""
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.utils.enable_progress_bars()


_DIGITS = re.compile(r"(\d+)")
SHOWN_SHARDS = 3  # shard names the order line shows at each end


def _parquet_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(os.path.join(glob.escape(path), "*" + PARQUET_SUFFIX)))
    if not files:
        raise ValueError(f"--data-path {path!r} is a directory with neither .parquet shards "
                         f"nor a datasets.save_to_disk dataset ({SAVE_TO_DISK_MARKER}); --sft "
                         "reads a JSONL file, a .parquet file or such a directory")
    _log_shard_order(path, [os.path.basename(f) for f in files])
    return files


def _numeric_key(name: str) -> list:
    """``part-2`` before ``part-10``: digit runs compared as numbers."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(name)]


def _log_shard_order(path: str, names: list[str]) -> None:
    """Says which order the shards are read in (rows are numbered in it: samples, splits and a
    resume follow it), and warns where numbered names would sort otherwise."""
    shown = names if len(names) <= 2 * SHOWN_SHARDS else \
        names[:SHOWN_SHARDS] + ["..."] + names[-SHOWN_SHARDS:]
    print_rank_0(f"> reading {len(names)} Parquet shard(s) of {path} in name order (as datasets "
                 f"and pyarrow read a folder): {', '.join(shown)}")
    numeric = sorted(names, key=_numeric_key)
    if numeric != names:
        first = next(i for i, (a, b) in enumerate(zip(names, numeric)) if a != b)
        warning_rank_0("--data-path %s: shard %s is read before %s (name order: their numbers "
                       "are not zero-padded); rename the shards with zero-padded numbers if "
                       "the rows should follow the numbers", path, names[first], numeric[first])


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise ValueError(f"SFT data {path!r} does not exist (--data-path)")
    if os.path.isfile(os.path.join(path, DATASET_DICT_MARKER)):
        splits = sorted(entry.name for entry in os.scandir(path) if entry.is_dir())
        raise ValueError(f"--data-path {path!r} holds a DatasetDict (splits: "
                         f"{', '.join(splits)}); point --data-path at one split's folder")


def load_arrow_table(path: str, keys: SFTKeys):
    """The ``datasets.Dataset`` of ``path`` with only the conversation's columns, which are
    checked for names and types; ValueError names the column and the flag."""
    datasets = _import_datasets()
    _check_path(path)
    with _quiet(datasets):
        saved = os.path.isfile(os.path.join(path, SAVE_TO_DISK_MARKER))
        if saved or path.endswith(ARROW_SUFFIX):
            dataset = _open_arrow(datasets, path)
            columns = _conversation_columns(path, dataset.features.arrow_schema, keys)
            return dataset.select_columns(columns)
        files = _parquet_files(path)
        columns = _check_parquet_footers(path, files, keys)
        try:
            return datasets.Dataset.from_parquet(files, columns=columns)
        except datasets.exceptions.DatasetGenerationError as err:  # e.g. shards that disagree
            raise ValueError(f"--data-path {path!r}: datasets cannot read the Parquet shards "
                             f"as one table ({one_line(err.__cause__ or err)})") from err


def _open_arrow(datasets, path: str):
    """A save_to_disk folder or one of its ``.arrow`` files, memory-mapped."""
    import pyarrow as pa

    if os.path.isdir(path):
        return datasets.load_from_disk(path)
    try:
        return datasets.Dataset.from_file(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"--data-path: {path} is not a readable Arrow file ({err})") from err


def _check_parquet_footers(path: str, files: list[str], keys: SFTKeys) -> list[str]:
    """Every shard is Parquet with the conversation's columns, and there are rows (footers
    only; datasets fails on an empty file); returns the columns to read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns, num_rows = None, 0
    for file in files:
        try:
            footer = pq.ParquetFile(file)
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"--data-path: {file} is not a readable Parquet file ({err})") \
                from err
        columns = _conversation_columns(file, footer.schema_arrow, keys)
        num_rows += footer.metadata.num_rows
    if num_rows == 0:
        raise ValueError(f"SFT data {path!r} has no samples (--data-path)")
    return columns


def _is_string(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _is_message_list(arrow_type) -> bool:
    import pyarrow as pa

    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
        return False
    message = arrow_type.value_type
    names = {message.field(i).name for i in range(message.num_fields)} \
        if pa.types.is_struct(message) else set()
    return {"role", "content"} <= names and all(
        _is_string(message.field(name).type) for name in ("role", "content"))


def _refuse_pretokenized_columns(path: str, schema) -> None:
    """A column of pre-tokenised data (``sft_unread.first_pretokenized``: a list column under a
    per-token name) is refused: only the conversation's columns are read. A column of null type
    (no row has a value) is not."""
    import pyarrow as pa

    list_types = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    found = first_pretokenized((field.name, any(is_list(field.type) for is_list in list_types))
                               for field in schema if not pa.types.is_null(field.type))
    if found is not None:
        raise ValueError(f"{path}: column {found!r} (pre-tokenised or pre-masked data) "
                         f"would be ignored: {PRETOKENIZED_HINT}")


def _conversation_columns(path: str, schema, keys: SFTKeys) -> list[str]:
    """The columns holding the conversation (messages first, as in JSONL), type-checked;
    a pre-tokenised column beside them is refused."""
    _refuse_pretokenized_columns(path, schema)
    if keys.messages in schema.names:
        arrow_type = schema.field(keys.messages).type
        if not _is_message_list(arrow_type):
            raise ValueError(f"{path}: column {keys.messages!r} (--sft-messages-key) has type "
                             f"{arrow_type}; expected a list of {{role: string, content: "
                             "string} messages")
        return [keys.messages]
    pair = {keys.prompt: "--sft-prompt-key", keys.response: "--sft-response-key"}
    if not all(name in schema.names for name in pair):
        raise ValueError(
            f"{path}: no column {keys.messages!r} (--sft-messages-key) nor both "
            f"{keys.prompt!r} (--sft-prompt-key) and {keys.response!r} (--sft-response-key); "
            f"its columns are {', '.join(schema.names)}")
    for name, flag in pair.items():
        arrow_type = schema.field(name).type
        if not _is_string(arrow_type):
            raise ValueError(f"{path}: column {name!r} ({flag}) has type {arrow_type}; "
                             "expected string")
    return list(pair)


def _bad_rows(batch, keys: SFTKeys) -> np.ndarray:
    """Row mask of ``batch`` (an Arrow record batch) whose conversation cannot be read:
    null or empty messages, a null message, role or content, a role not in CHAT_ROLES, a system
    message after the first (parse_turns), a field ``sft_unread`` refuses; a null prompt or
    response."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if keys.messages not in batch.schema.names:
        return np.asarray(pc.or_(batch.column(keys.prompt).is_null(),
                                 batch.column(keys.response).is_null()))
    messages = batch.column(keys.messages)
    bad = np.asarray(messages.is_null()) | (
        np.asarray(pc.list_value_length(messages).fill_null(0)) == 0)
    flat = pc.list_flatten(messages)
    roles, contents = pc.struct_field(flat, "role"), pc.struct_field(flat, "content")
    known = pc.is_in(roles, value_set=pa.array(CHAT_ROLES)).fill_null(False)
    parents = np.asarray(pc.list_parent_indices(messages))
    bad_message = (np.asarray(flat.is_null()) | ~np.asarray(known)
                   | np.asarray(contents.is_null()) | _unread_message_fields(flat, roles)
                   | (np.asarray(pc.equal(roles, SYSTEM_ROLE).fill_null(False))
                      & ~_first_of_each_list(parents)))
    bad[parents[bad_message]] = True
    return bad


def _unread_message_fields(flat, roles) -> np.ndarray:
    """Message mask: a non-null field the template would need (``tool_calls``, ...), or a
    ``weight`` that disagrees with the mask (``sft_unread.refuse_unread_message_keys``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = np.zeros(len(flat), dtype=bool)
    names = {flat.type.field(i).name for i in range(flat.type.num_fields)}
    for name in names.intersection(UNRENDERED_MESSAGE_KEYS):
        bad |= _holds_something(pc.struct_field(flat, name))
    if WEIGHT_KEY in names:
        weight = pc.struct_field(flat, WEIGHT_KEY)
        given = np.asarray(weight.is_valid())
        if pa.types.is_integer(weight.type) or pa.types.is_floating(weight.type) \
                or pa.types.is_boolean(weight.type):
            trained = np.asarray(pc.equal(roles, TRAINED_ROLE).fill_null(False))
            values = np.asarray(pc.cast(weight, pa.float64()).fill_null(0.0))
            bad |= given & (values != trained)
        else:  # a string or other weight never equals the 0/1 that parse_turns compares with
            bad |= given
    return bad


def _num_without_assistant(batch, keys: SFTKeys) -> int:
    """Rows of ``batch`` whose messages hold no assistant turn: nothing to train on. A
    prompt/response row always has one (the response)."""
    import pyarrow.compute as pc

    if keys.messages not in batch.schema.names:
        return 0
    messages = batch.column(keys.messages)
    flat = pc.list_flatten(messages)
    is_assistant = np.asarray(pc.equal(pc.struct_field(flat, "role"), TRAINED_ROLE)
                              .fill_null(False))
    with_assistant = np.unique(np.asarray(pc.list_parent_indices(messages))[is_assistant])
    return batch.num_rows - with_assistant.size


def _first_of_each_list(parents: np.ndarray) -> np.ndarray:
    """Mask of the flattened items that open their list (``parents``: each item's list)."""
    first = np.ones(len(parents), dtype=bool)
    first[1:] = parents[1:] != parents[:-1]
    return first


def _holds_something(values) -> np.ndarray:
    """Mask of ``values`` that are neither null nor an empty list or string (what
    ``sft_unread.refuse_unread_message_keys`` treats as absent)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        return np.asarray(pc.list_value_length(values).fill_null(0)) > 0
    if _is_string(values.type):
        return np.asarray(pc.utf8_length(values).fill_null(0)) > 0
    return np.asarray(values.is_valid())


def check_rows(dataset, path: str, keys: SFTKeys) -> int:
    """Every row can be read (:func:`_bad_rows`, batch by batch); the first that cannot is a
    ValueError with parse_turns' message, as the JSONL reader gives it. Returns how many rows
    have no assistant turn."""
    first = num_without_assistant = 0
    for batch in dataset.data.to_batches(max_chunksize=CHECK_BATCH_ROWS):
        bad = np.flatnonzero(_bad_rows(batch, keys))
        if bad.size:
            row = first + int(bad[0])
            try:
                parse_turns(dataset[row], keys)
            except ValueError as err:
                raise ValueError(f"{path} row {row}: {err}") from err
            raise AssertionError(f"{path} row {row} was flagged but parses")
        num_without_assistant += _num_without_assistant(batch, keys)
        first += batch.num_rows
    if first == 0:
        raise ValueError(f"SFT data {path!r} has no samples (--data-path)")
    return num_without_assistant


class ArrowSFTDataset(torch.utils.data.Dataset):
    """One sample per row, in row order, tokenized when read (see the module docstring).

    Args: as :class:`megatron.varlen_training.datasets.sft.SFTDataset`.

    Attributes:
        num_without_assistant: Rows with no assistant turn (counted at start-up and warned
            about, as the JSONL reader counts its fully masked samples); a row trained on
            nothing because truncation cut its assistant turns off is not counted.
    """

    def __init__(self, path: str, tokenizer: Tokenizer, seq_length: int,
                 pad_to_multiple_of: int = 1, pad_to_seq_length: bool = False,
                 keys: SFTKeys = SFTKeys()):
        if seq_length < 1:
            raise ValueError(f"--seq-length must be >= 1, got {seq_length}")
        self._rows = load_arrow_table(path, keys)
        self.num_without_assistant = check_rows(self._rows, path, keys)
        if self.num_without_assistant:
            warning_rank_0("ArrowSFTDataset: %d of %d rows in %s have no assistant turn to train "
                           "on (loss_mask all 0)", self.num_without_assistant, len(self._rows),
                           path)
        self._path, self._keys, self._tokenizer = path, keys, tokenizer
        self._seq_length = seq_length
        self._pad_to_multiple_of = pad_to_multiple_of
        self._padded_length = seq_length if pad_to_seq_length else None
        self.truncated_rows: dict[int, int] = {}  # row -> tokens cut, for rows read so far

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        ids, is_target = encode_record(self._rows[idx], self._tokenizer, self._keys,
                                       f"{self._path} row {idx}")
        if len(ids) > self._seq_length + 1:
            self._count_truncation(idx, len(ids) - (self._seq_length + 1))
            ids, is_target = truncate(ids, is_target, self._seq_length)
        return make_sample(ids, is_target, idx, self._tokenizer.pad, self._pad_to_multiple_of,
                           self._padded_length)

    @property
    def path(self) -> str:
        """``--data-path`` as given."""
        return self._path

    @property
    def seq_length(self) -> int:
        """``--seq-length``: rows longer than it plus one id are truncated."""
        return self._seq_length

    def _count_truncation(self, idx: int, tokens_cut: int) -> None:
        # Rows are tokenized when read, by the rank that reads them: no count up front.
        if not self.truncated_rows:
            warning_all_ranks("ArrowSFTDataset: row %d of %s is longer than --seq-length %d and "
                              "was truncated (the rows and tokens cut are counted; the count "
                              "is printed at the end of training)", idx, self._path,
                              self._seq_length)
        self.truncated_rows[idx] = tokens_cut
