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
from megatron.core.datasets.indexed_dataset import (
    DType, IndexedDataset, get_bin_path, get_idx_path,
)

from megatron.varlen_training.tokenizer import tokenizer_flags

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
LENGTH_BYTES, POINTER_BYTES, DOCUMENT_BYTES = 4, 8, 8  # int32, int64, int64
SPLIT_NAMES = ("training", "validation", "test")
SPLIT_HINT = "e.g. --split 90,10,0"


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


# A larger share for an empty split that is read, and what else fixes it (the test split is
# read at the end of training).
_SHARE_HINTS = {"test": "e.g. --split 90,5,5"}
EMPTY_SPLIT_FIXES = {"validation": " or set --eval-iters 0",
                "test": " or none (e.g. --split 98,2,0: no test evaluation) or set --eval-iters 0"}


def check_split_not_empty(prefix: str, lengths: np.ndarray, bounds: tuple[int, int],
                          split_index: int, where: str) -> None:
    """A split that is read must hold at least one token (megatron-core would loop forever
    looking for its first sample otherwise).

    Args:
        where: How the split was made, for the message (``--split '...'`` or the flag).
    """
    begin, end = bounds
    if end > begin and int(lengths[begin:end].sum()) > 0:
        return
    name = SPLIT_NAMES[split_index]
    raise ValueError(f"{where} leaves the {name} split of {prefix} empty ({end - begin} of its "
                     f"{len(lengths)} documents, {int(lengths[begin:end].sum())} tokens): give "
                     f"the {name} split a larger share ({_SHARE_HINTS.get(name, SPLIT_HINT)})"
                     + EMPTY_SPLIT_FIXES.get(name, ""))


def check_cache_writable(cache_dir: str, flag_hint: str) -> None:
    """megatron-core writes its sample indices to ``cache_dir`` (on global rank 0): its nearest
    existing ancestor must be a writable directory."""
    probe = os.path.abspath(cache_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"megatron-core caches its sample indices in {cache_dir}, but {probe} "
                         f"is not a writable directory; {flag_hint}")
