"""Start-up checks of an indexed dataset's token ids against this run's tokenizer.

An .idx/.bin pair does not say which tokenizer wrote it. Two mistakes would otherwise train
silently on wrong data:

- **ids outside the vocabulary** (data made with a larger tokenizer): every rank scans the
  start of its 1/world share of the documents of the splits the run reads (megatron-core's
  samples are cut from them), at most ``SCAN_BUDGET_TOKENS`` ids of the memory-mapped ``.bin``
  in chunks, before the first step; one id at or above the tokenizer's vocabulary is a
  one-line error naming the id, its document, the vocabulary size and the flags (the caller
  agrees on it across ranks). The budget bounds the start-up cost (a whole pretraining corpus
  would be minutes of reading per start); data from another tokenizer shows ids above the
  vocabulary within any few million tokens, so the sample still catches it. An id beyond the
  scanned part fails in the embedding instead.
- **megatron-core's byte-level layout** under ours: megatron-core's ``ByteLevelTokenizer``
  (``megatron.core.tokenizers.text.libraries``) maps bytes to ids 0-255 and ends a document
  with eod **0** (pad 1, vocabulary 512); this fork's ``--tokenizer-type ByteLevelTokenizer``
  keeps 0-255 for bytes and puts eod at **256** (then pad and the chat role ids), so that no
  byte doubles as a special id. Both fit in the ids 0-255, so the vocabulary check cannot tell
  them apart: data preprocessed with ``--append-eod`` by megatron-core's tokenizer ends every
  document with 0 (a NUL byte, which text does not end with). If the first documents all end
  with 0 and none with our eod, the run is refused in one line.
- **documents without an eod** (text preprocessed without ``--append-eod``): samples cut from
  the concatenated documents run them together unmarked. With ``--reset-position-ids``,
  ``--reset-attention-mask`` or ``--eod-mask-loss``, which find documents by their eod, the run
  is refused in one line (the flags would change nothing); without them it is a warning.
"""

from __future__ import annotations

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset, get_bin_path

from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.tokenizer import tokenizer_flags

# tokenizer class -> (the document-end id of a tokenizer of the same name elsewhere, its name)
FOREIGN_EODS = {"ByteLevelTokenizer": (0, "megatron-core's ByteLevelTokenizer (bytes 0-255, "
                                          "eod 0, pad 1)")}
DOCUMENT_ENDS_LOOKED_AT = 16  # the first documents whose last id tells the eod apart
SCAN_CHUNK_TOKENS = 1 << 24  # ids per numpy max over the memory-mapped .bin (32 MiB of uint16)
SCAN_BUDGET_TOKENS = 1 << 26  # ids a rank scans at most (128 MiB of uint16: well under a second)


def rank_share(bounds: tuple[int, int], rank: int, world: int) -> tuple[int, int]:
    """This rank's contiguous part of the document range ``bounds``."""
    begin, end = bounds
    count = end - begin
    return begin + count * rank // world, begin + count * (rank + 1) // world


def check_token_ids(prefix: str, dataset: IndexedDataset, bounds: tuple[int, int],
                    vocab_size: int, flag: str, rank: int = 0, world: int = 1, *,
                    tokenizer_type: str) -> None:
    """Every id in this rank's share of the documents ``bounds`` is below ``vocab_size``, the
    size of the run's ``tokenizer_type`` (``--tokenizer-type``).

    Raises:
        ValueError: One line naming the id, its document, the vocabulary size and the flags
            that chose that tokenizer.
    """
    begin, end = rank_share(bounds, rank, world)
    if end <= begin:
        return
    itemsize = np.dtype(dataset.index.dtype).itemsize
    starts = dataset.index.sequence_pointers // itemsize  # each document's first id
    lengths = dataset.sequence_lengths
    first, stop = int(starts[begin]), int(starts[end - 1]) + int(lengths[end - 1])
    stop = min(stop, first + SCAN_BUDGET_TOKENS)
    ids = np.memmap(get_bin_path(prefix), dtype=dataset.index.dtype, mode="r")
    for chunk_start in range(first, stop, SCAN_CHUNK_TOKENS):
        chunk = ids[chunk_start:min(stop, chunk_start + SCAN_CHUNK_TOKENS)]
        if int(chunk.max()) < vocab_size:
            continue
        offset = chunk_start + int(np.argmax(chunk >= vocab_size))
        document = int(np.searchsorted(starts, offset, side="right")) - 1
        raise ValueError(
            f"{flag}: {prefix}.bin holds token id {int(ids[offset])} (document {document}, "
            f"position {offset - int(starts[document])}) but the tokenizer has {vocab_size} ids "
            f"({tokenizer_flags(tokenizer_type)}): the data was made with another tokenizer; "
            f"preprocess it again with this one (tools/preprocess_data.py)")


def first_document_ends(dataset: IndexedDataset) -> list[int]:
    """The last id of each of the first ``DOCUMENT_ENDS_LOOKED_AT`` non-empty documents."""
    lengths = dataset.sequence_lengths
    looked_at = np.flatnonzero(lengths > 0)[:DOCUMENT_ENDS_LOOKED_AT]  # not a loop: 1e9 docs
    return [int(dataset.get(int(index), offset=int(lengths[index]) - 1, length=1)[0])
            for index in looked_at]


def check_documents_marked(prefix: str, dataset: IndexedDataset, eod: int,
                           reset_flags: list[str], flag: str) -> None:
    """Megatron's samples run the documents together: only an eod id at each document's end
    tells them apart (for the model, and for ``--reset-position-ids``,
    ``--reset-attention-mask`` and ``--eod-mask-loss``). When none of the first documents ends
    with it (text preprocessed without ``--append-eod``), the reset flags would find no
    boundary and do nothing: refused in one line; without them it is a warning (pre-cut
    documents need no eod)."""
    ends = first_document_ends(dataset)
    if not ends or eod in ends:
        return
    what = (f"{flag}: none of the first {len(ends)} documents of {prefix} ends with the eod id "
            f"{eod} (preprocessed without --append-eod?)")
    fix = "preprocess the text again with tools/preprocess_data.py --append-eod"
    if reset_flags:
        raise ValueError(f"{what}, so {', '.join(reset_flags)} would find no document "
                         f"boundary in its samples and change nothing: {fix}")
    warning_rank_0("%s: its samples run documents together with nothing between them; %s "
                   "unless the documents are already cut to size", what, fix)


def check_document_ends(prefix: str, dataset: IndexedDataset, tokenizer_name: str, eod: int,
                        flag: str) -> None:
    """Refuses data whose documents end with another tokenizer's eod of the same name
    (module docstring); other data (ours, or preprocessed without ``--append-eod``) passes."""
    if tokenizer_name not in FOREIGN_EODS:
        return
    foreign, foreign_name = FOREIGN_EODS[tokenizer_name]
    ends = first_document_ends(dataset)
    if not ends or any(end != foreign for end in ends):
        return
    raise ValueError(
        f"{flag}: the first {len(ends)} documents of {prefix} all end with id {foreign}, the eod "
        f"of {foreign_name}; this run's --tokenizer-type {tokenizer_name} ends documents with "
        f"{eod} (bytes 0-255, then eod, pad and the chat roles), so its documents would run "
        f"together unmarked: preprocess the text again with tools/preprocess_data.py "
        f"--tokenizer-type {tokenizer_name} --append-eod")
