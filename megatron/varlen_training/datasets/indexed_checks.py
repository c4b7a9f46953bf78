"""Start-up checks of Megatron indexed datasets, before megatron-core reads them.

megatron-core's builder reads the files on global rank 0 first and then meets the other ranks
at a barrier: an exception there (a missing .bin, a foreign .idx, an empty split, a read-only
cache directory) leaves every other rank waiting at that barrier. So everything a user can get
wrong is checked here first, on every rank, and reported in one line naming the prefix, the
value, the limit and the flag to change (the caller agrees on the error across ranks).

An .idx file (megatron-core's ``_IndexWriter``) starts with a fixed header: 9 magic bytes,
version (uint64, 1), the token dtype code (uint8), the sequence count and the document count
(uint64 each); then int32 lengths and int64 byte offsets per sequence and int64 document
boundaries. Only the header is read here; the rest through megatron-core's ``IndexedDataset``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
from megatron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix, parse_and_normalize_split,
)
from megatron.core.datasets.indexed_dataset import (
    DType, IndexedDataset, get_bin_path, get_idx_path,
)

from megatron.varlen_training.tokenizer import tokenizer_flags

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
LENGTH_BYTES, POINTER_BYTES, DOCUMENT_BYTES = 4, 8, 8  # int32, int64, int64
SPLIT_NAMES = ("training", "validation", "test")
TRAIN, VALID, TEST = range(len(SPLIT_NAMES))
SPLIT_HINT = "e.g. --split 90,10,0"  # for a split given no share at all


@dataclass(frozen=True)
class IndexHeader:
    """What an .idx header says: the token dtype and the sequence and document counts."""

    dtype: type
    num_sequences: int
    num_documents: int

    @property
    def index_bytes(self) -> int:
        """The .idx file's size these counts imply."""
        return (_HEADER.size + self.num_sequences * (LENGTH_BYTES + POINTER_BYTES)
                + self.num_documents * DOCUMENT_BYTES)


def read_index_header(prefix: str, flag: str) -> IndexHeader:
    """The header of ``prefix``.idx, after checking that both files exist.

    Raises:
        ValueError: one line naming the prefix, the missing/odd file and ``flag``.
    """
    idx_path, bin_path = get_idx_path(prefix), get_bin_path(prefix)
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise ValueError(_missing_file(prefix, path, flag))
    with open(idx_path, "rb") as stream:
        raw = stream.read(_HEADER.size)
    if len(raw) < _HEADER.size or raw[:len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise ValueError(f"{flag}: {idx_path} is not a Megatron index file (no MMIDIDX header); "
                         f"rebuild it with tools/preprocess_data.py")
    _, version, code, num_sequences, num_documents = _HEADER.unpack(raw)
    if version != INDEX_VERSION:
        raise ValueError(f"{flag}: {idx_path} has index version {version}; megatron-core reads "
                         f"version {INDEX_VERSION}")
    try:
        dtype = DType.dtype_from_code(code)
    except ValueError:
        raise ValueError(f"{flag}: {idx_path} names token dtype code {code}, which is none of "
                         f"megatron-core's ({', '.join(d.name for d in DType)})") from None
    return IndexHeader(dtype, num_sequences, num_documents)


# Files --sft reads (JSONL, Parquet, Arrow): given without --sft, the likeliest slip.
SFT_DATA_EXTENSIONS = (".jsonl", ".json", ".parquet", ".arrow")


def _missing_file(prefix: str, path: str, flag: str) -> str:
    stem, extension = os.path.splitext(prefix)
    if extension in (".bin", ".idx"):  # the commonest slip: a file name for the prefix
        return (f"{flag}: {prefix!r} is a file name; indexed datasets are named by their prefix "
                f"(pass {stem!r} for {stem}.bin and {stem}.idx)")
    if os.path.exists(prefix) and extension in SFT_DATA_EXTENSIONS:
        return (f"{flag}: {prefix!r} is SFT data, not an indexed dataset prefix: add --sft to "
                f"train on its conversations, or preprocess it with tools/preprocess_data.py")
    return (f"{flag}: indexed dataset {prefix!r} has no {os.path.basename(path)} ({path} does "
            f"not exist); a dataset is the pair PREFIX.bin + PREFIX.idx that "
            f"tools/preprocess_data.py writes")


def check_dtype_holds_vocabulary(prefix: str, dtype: type, vocab_size: int, flag: str,
                                 tokenizer_type: str) -> None:
    """The token ids were written as ``dtype``: it must hold every id of the vocabulary of the
    run's ``tokenizer_type`` (the refusal names the flags that chose it)."""
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"{flag}: {prefix} stores tokens as {np.dtype(dtype).name}, not as "
                         f"integer ids; rebuild it with tools/preprocess_data.py")
    largest = int(np.iinfo(dtype).max)
    if largest < vocab_size - 1:
        raise ValueError(f"{flag}: {prefix} stores token ids as {np.dtype(dtype).name} (at most "
                         f"{largest}) but the tokenizer has {vocab_size} ids "
                         f"({tokenizer_flags(tokenizer_type)}): it was made with another "
                         f"tokenizer; preprocess it again with this one")


def open_checked(prefix: str, vocab_size: int, mmap: bool, flag: str,
                 tokenizer_type: str) -> IndexedDataset:
    """megatron-core's ``IndexedDataset`` of ``prefix`` once the pair is known to belong
    together: header, dtype (holds the ids of ``tokenizer_type``, ``vocab_size`` of them), and
    both file sizes agree with the index.

    Raises:
        ValueError: one line naming the prefix, the sizes and ``flag``.
    """
    header = read_index_header(prefix, flag)
    check_dtype_holds_vocabulary(prefix, header.dtype, vocab_size, flag, tokenizer_type)
    idx_bytes = os.path.getsize(get_idx_path(prefix))
    if idx_bytes != header.index_bytes:
        raise ValueError(f"{flag}: {get_idx_path(prefix)} has {idx_bytes} bytes, its header "
                         f"({header.num_sequences} sequences, {header.num_documents} document "
                         f"boundaries) needs {header.index_bytes}: the file is truncated or "
                         f"damaged; rebuild it with tools/preprocess_data.py")
    if os.path.getsize(get_bin_path(prefix)) == 0:  # megatron-core: "cannot mmap an empty file"
        raise ValueError(f"{flag}: {get_bin_path(prefix)} is empty ({header.num_sequences} "
                         f"sequences, none with a token): a dataset needs tokens; check the "
                         f"input given to tools/preprocess_data.py")
    dataset = IndexedDataset(prefix, multimodal=False, mmap=mmap)
    lengths, pointers = dataset.sequence_lengths, dataset.index.sequence_pointers
    itemsize = np.dtype(header.dtype).itemsize
    need = int(pointers[-1]) + int(lengths[-1]) * itemsize if len(lengths) else 0
    have = os.path.getsize(get_bin_path(prefix))
    if have != need:
        raise ValueError(f"{flag}: {get_bin_path(prefix)} has {have} bytes but "
                         f"{get_idx_path(prefix)} describes {need} ({len(lengths)} sequences of "
                         f"{np.dtype(header.dtype).name}): the .bin and .idx do not belong "
                         f"together; write both again with tools/preprocess_data.py")
    return dataset


def split_ranges(num_documents: int, split_matrix) -> list[tuple[int, int] | None]:
    """The document range megatron-core gives each split (``BlendedMegatronDatasetBuilder``:
    ``round(share * N)`` at both ends of each split's book-ends)."""
    return [None if bounds is None else
            (int(round(bounds[0] * num_documents)), int(round(bounds[1] * num_documents)))
            for bounds in split_matrix]


PERCENT = 100  # a suggested --split is written in whole percents


def _empty_splits(percents, lengths: np.ndarray, needed) -> list[int]:
    """The splits of ``needed`` that ``percents`` leaves without a token (documents of
    ``lengths`` tokens, split by megatron-core's arithmetic: :func:`split_ranges`)."""
    ranges = split_ranges(len(lengths), convert_split_vector_to_split_matrix(
        parse_and_normalize_split(_split_flag(percents))))  # as a run given it parses it
    return [i for i in needed if ranges[i] is None or int(lengths[slice(*ranges[i])].sum()) == 0]


def split_that_fills(split: str, lengths: np.ndarray, needed) -> str | None:
    """The ``--split`` in whole percents nearest ``split`` (least squared change of the shares)
    under which every split index in ``needed`` holds a token of the documents of ``lengths``
    tokens, a split without a share that is not read keeping none; None if none does (too few
    documents). Every split of three shares is tried (~5k; ~0.1 s, on an error path only)."""
    wanted = [PERCENT * share for share in parse_and_normalize_split(split)]
    unshared = [i for i, share in enumerate(wanted) if share == 0 and i not in needed]
    candidates = [(train, valid, PERCENT - train - valid) for train in range(PERCENT + 1)
                  for valid in range(PERCENT + 1 - train)]
    fitting = [c for c in candidates if not any(c[i] for i in unshared)
               and not _empty_splits(c, lengths, needed)]
    best = min(fitting, key=lambda c: sum((a - b) ** 2 for a, b in zip(c, wanted)), default=None)
    return None if best is None else _split_flag(best)


def _split_flag(percents) -> str:
    return ",".join(map(str, percents))


def empty_split_fix(split: str, lengths: np.ndarray, split_index: int, needed,
                    unit: str = "documents") -> str:
    """What gives the empty split ``split_index`` (read, so in ``needed``) a document: a larger
    share (a ``--split`` checked to fill every read split), else more documents; then the ways
    out that read it no more (the test split is read at the end of training). ``unit``: what
    the message calls the documents (an SFT file's samples)."""
    name = SPLIT_NAMES[split_index]
    better = split_that_fills(split, lengths, needed)
    fix = (f"give the {name} split a larger share (e.g. --split {better})" if better else
           f"{len(lengths)} {unit} are too few to give each split that is read one: "
           f"add {unit}")
    if split_index == VALID:
        return fix + " or set --eval-iters 0"
    if split_index == TEST:
        without_test = split_that_fills(_without_test_share(split), lengths,
                                        [i for i in needed if i != TEST])
        if without_test:
            fix += f" or none (e.g. --split {without_test}: no test evaluation)"
        return fix + " or set --eval-iters 0"
    return fix


def _without_test_share(split: str) -> str:
    train, valid, _ = parse_and_normalize_split(split)
    return f"{train},{valid},0"


def check_split_not_empty(prefix: str, lengths: np.ndarray, bounds: tuple[int, int],
                          split_index: int, split: str, needed) -> None:
    """A split that is read must hold at least one token (megatron-core would loop forever
    looking for its first sample otherwise).

    Args:
        split: The ``--split`` value that made it.
        needed: Every split index the run reads (a suggested ``--split`` must fill them all).
    """
    begin, end = bounds
    tokens = int(lengths[begin:end].sum())
    if end > begin and tokens > 0:
        return
    raise ValueError(f"--split {split!r} leaves the {SPLIT_NAMES[split_index]} split of {prefix} "
                     f"empty ({end - begin} of its {len(lengths)} documents, {tokens} tokens): "
                     + empty_split_fix(split, lengths, split_index, needed))


def check_cache_writable(cache_dir: str, flag_hint: str) -> None:
    """megatron-core writes its sample indices to ``cache_dir`` (on global rank 0): its nearest
    existing ancestor must be a writable directory."""
    probe = os.path.abspath(cache_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"megatron-core caches its sample indices in {cache_dir}, but {probe} "
                         f"is not a writable directory; {flag_hint}")
