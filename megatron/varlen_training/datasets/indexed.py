"""Megatron indexed pretraining data (``--data-path PREFIX ...``) through megatron-core.

The datasets are megatron-core's own: ``BlendedMegatronDatasetBuilder`` builds a
``GPTDataset`` per dataset prefix and split (a ``BlendedDataset`` over them for a blend) from a
``GPTDatasetConfig`` made of Megatron-LM's flags, exactly as Megatron-LM's pretrain_gpt.py
does: the same seed (``--seed``), sequence length, blend, ``--split`` and sample counts
(``--train-iters x --global-batch-size`` for training, every evaluation's batches for
validation), hence the same sample stream, cached under ``--data-cache-path``.

What a sample is (Megatron-LM's): megatron-core concatenates the split's documents in a
shuffled order (epoch after epoch) and cuts the stream into pieces of ``--seq-length + 1``
ids, regardless of document boundaries (a document preprocessed with ``--append-eod`` ends in
eod); sample ``i`` is the ``i``-th piece in a shuffled order. Here it becomes this fork's sample
(:mod:`.sample`): ``tokens = ids[:-1]``, ``labels = ids[1:]``, real length ``--seq-length``,
``loss_mask`` and ``position_ids`` as megatron-core returns them, ``sample_id = i``. Training
reads sample ``iteration * global batch + k`` (:mod:`megatron.varlen_training.data`), on every
layout and packed or not, so the stream, and where a resumed run continues it, depend only on
the iteration. With ``--sequence-packing`` a sample is still one such piece (one THD sequence).

The test split is Megatron-LM's too: the share ``--split`` gives it (the default
``969,30,1`` gives one) or ``--test-data-path``, read once at the end of training
(``--eval-iters`` global batches, :mod:`megatron.varlen_training.evaluation`); a test split
without a share is not built (no test evaluation), nor any split with ``--eval-iters 0``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import Split, get_blend_from_list

from megatron.varlen_training.config import DataConfig
from megatron.varlen_training.datasets import indexed_checks, token_checks
from megatron.varlen_training.datasets.core_builder import RankLocalBuilder, build_in_rank_order
from megatron.varlen_training.datasets.sample import roundup
from megatron.varlen_training.document_arguments import PACKING_UNIT_DOCUMENT
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.log import print_rank_0, warning_rank_0
from megatron.varlen_training.tokenizer import Tokenizer

# megatron-core's "no pad token" id (megatron_dataset._PAD_TOKEN_ID): with a tokenizer whose
# pad is its eod, no id in the data may be taken for padding.
NO_PAD_ID = -1
PER_SPLIT_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")
# megatron-core's default index cache beside a dataset: PREFIX/cache/GPTDataset_indices.
DEFAULT_CACHE_PARTS = ("cache", "GPTDataset_indices")


@dataclass(frozen=True)
class CoreTokenizer:
    """What megatron-core's datasets read of a tokenizer: its size, eod and pad ids, and the
    identifiers that name its index cache (``unique_identifiers``)."""

    name: str
    vocab_size: int
    eod: int
    pad: int

    @property
    def unique_identifiers(self) -> dict:
        return {"class": self.name, "vocab_size": self.vocab_size, "eod": self.eod,
                "pad": self.pad}


def core_tokenizer(tokenizer: Tokenizer) -> CoreTokenizer:
    pad = NO_PAD_ID if tokenizer.pad == tokenizer.eod else tokenizer.pad
    return CoreTokenizer(type(tokenizer).__name__, tokenizer.vocab_size, tokenizer.eod, pad)


def gpt_dataset_config(data: DataConfig, seq_length: int, seed: int,
                       tokenizer: Tokenizer) -> GPTDatasetConfig:
    """megatron-core's config of the run's indexed data (Megatron-LM's mapping of its flags)."""
    per_split = None
    if data.data_path is None:
        per_split = [get_blend_from_list(list(paths)) if paths else None for paths in
                     (data.train_data_path, data.valid_data_path, data.test_data_path)]
    return GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=get_blend_from_list(list(data.data_path)) if data.data_path else None,
        blend_per_split=per_split,
        split=data.split if data.data_path else None,
        path_to_cache=data.data_cache_path,
        mmap_bin_files=data.mmap_bin_files,
        tokenizer=core_tokenizer(tokenizer),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # attention is causal per sequence; no dense mask
        num_dataset_builder_threads=data.num_dataset_builder_threads,
        mid_level_dataset_surplus=data.mid_level_dataset_surplus,
        allow_ambiguous_pad_tokens=data.allow_ambiguous_pad_tokens,
    )


def split_sizes(data: DataConfig, config: GPTDatasetConfig | None = None) -> list[int]:
    """Samples each split must provide: training, validation, and test when ``config`` gives
    the test split documents (a ``--split`` share or ``--test-data-path``; none without
    ``config``), as Megatron-LM builds a test set only then."""
    return [data.train_samples, data.eval_samples,
            data.test_samples if config is not None and _has_test_split(config) else 0]


def _has_test_split(config: GPTDatasetConfig) -> bool:
    if config.blend_per_split is not None:
        return config.blend_per_split[Split.test.value] is not None
    return config.split_matrix[Split.test.value] is not None


def skip_unread_splits(config: GPTDatasetConfig, sizes: list[int]) -> None:
    """Leaves splits nobody reads (size 0) unbuilt; the others keep their documents."""
    for split in Split:
        if sizes[split.value]:
            continue
        if config.blend_per_split is not None:
            config.blend_per_split[split.value] = None
        else:
            config.split_matrix[split.value] = None


def check_indexed_data(config: GPTDatasetConfig, data: DataConfig, sizes: list[int]) -> None:
    """Every file, dtype, split, token id and cache problem as a one-line ValueError
    (indexed_checks, token_checks); each rank scans its share of the ids. Whole documents
    (``--packing-unit document``) write nothing to megatron-core's cache, so a read-only data
    folder is no problem for them (a blend's table reports its own: blending_cache.py)."""
    tokenizer = config.tokenizer
    rank, world = _rank_and_world()
    sources = _sources(config, data, sizes)
    for prefix, flag, needed in sources:
        dataset = indexed_checks.open_checked(prefix, tokenizer.vocab_size,
                                              config.mmap_bin_files, flag, data.tokenizer_type)
        lengths = dataset.sequence_lengths
        ranges = (indexed_checks.split_ranges(len(lengths), config.split_matrix)
                  if config.blend is not None else [(0, len(lengths))] * len(Split))
        token_checks.check_document_ends(prefix, dataset, tokenizer.name, tokenizer.eod, flag)
        if data.packing_unit != PACKING_UNIT_DOCUMENT:  # whole documents need no eod
            token_checks.check_documents_marked(prefix, dataset, tokenizer.eod,
                                                _reset_flags(data), flag)
        for split in needed:
            if config.blend is not None:  # a dataset of its own split holds tokens (.bin)
                indexed_checks.check_split_not_empty(prefix, lengths, ranges[split], split,
                                                     data.split, needed)
            token_checks.check_token_ids(prefix, dataset, ranges[split], tokenizer.vocab_size,
                                         flag, rank, world, tokenizer_type=data.tokenizer_type)
        if data.packing_unit != PACKING_UNIT_DOCUMENT:  # whole documents build no GPTDataset
            cache = config.path_to_cache or os.path.join(prefix, *DEFAULT_CACHE_PARTS)
            hint = ("choose a writable --data-cache-path" if config.path_to_cache
                    else "pass a writable --data-cache-path")
            indexed_checks.check_cache_writable(cache, hint)


def _reset_flags(data: DataConfig) -> list[str]:
    """The given flags that find documents by their eod id."""
    return [flag for flag, on in (("--reset-position-ids", data.reset_position_ids),
                                  ("--reset-attention-mask", data.reset_attention_mask),
                                  ("--eod-mask-loss", data.eod_mask_loss)) if on]


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _sources(config: GPTDatasetConfig, data: DataConfig, sizes: list[int]):
    """(prefix, flag, the splits read from it) of every dataset the run reads."""
    if config.blend is not None:
        needed = [split.value for split in Split if sizes[split.value]]
        for split in needed:
            if config.split_matrix[split] is None:
                reader = ("--eval-iters asks for validation" if split == Split.valid.value
                          else "training reads it")
                fix = " or set --eval-iters 0" if split == Split.valid.value else ""
                raise ValueError(
                    f"--split {data.split!r} gives the {indexed_checks.SPLIT_NAMES[split]} "
                    f"split no share, but {reader}: give it a share "
                    f"({indexed_checks.SPLIT_HINT}){fix}")
        return [(prefix, "--data-path", needed) for prefix in config.blend[0]]
    sources = []  # every named dataset's files are checked, read or not (a typo is not ignored)
    for split, blend in enumerate(config.blend_per_split):
        if blend is not None:
            needed = [split] if sizes[split] else []
            sources += [(prefix, PER_SPLIT_FLAGS[split], needed) for prefix in blend[0]]
    return sources


def check_enough_samples(core, needed: int, split: Split, data: DataConfig) -> None:
    """megatron-core builds a blend without weights from one epoch of each dataset, whatever
    the run needs: refuse a split that cannot supply the run's samples, in one line."""
    if core is None or not needed or len(core) >= needed:
        return
    flag = "--data-path" if data.data_path else PER_SPLIT_FLAGS[split.value]
    what = {Split.train: "training samples (--train-iters x --global-batch-size)",
            Split.valid: "validation samples (--eval-iters x --global-batch-size per evaluation)",
            Split.test: "test samples (--eval-iters x --global-batch-size)"}[split]
    raise ValueError(
        f"{flag} lists its datasets without weights: megatron-core then reads one epoch of "
        f"each, {len(core)} {split.name} samples, fewer than the run's {needed} {what}; give "
        f"each dataset a weight ('{flag} 0.5 PREFIX_A 0.5 PREFIX_B': as many epochs as "
        f"needed) or read fewer samples")


class IndexedGPTSamples(torch.utils.data.Dataset):
    """The first ``num_samples`` samples of a megatron-core GPT dataset (a ``GPTDataset`` or
    a ``BlendedDataset`` of them) in this fork's sample format (module docstring).

    Args:
        core: The megatron-core dataset; ``core[i]`` gives ``tokens``, ``labels``,
            ``loss_mask`` and ``position_ids`` of ``--seq-length`` ids each.
        num_samples: Samples this split provides (megatron-core builds at least as many).
        pad_id: Id written to tokens and labels on padding positions.
        pad_to_multiple_of: The padded length is the real length rounded up to this.
        padded_length: Exact padded length instead (the unpacked baseline: ``--seq-length``).
    """

    def __init__(self, core, num_samples: int, pad_id: int, pad_to_multiple_of: int = 1,
                 padded_length: int | None = None):
        assert len(core) >= num_samples, f"megatron-core built {len(core)} < {num_samples}"
        self.core = core
        self._num_samples = num_samples
        self._pad_id = pad_id
        self._pad_to_multiple_of = pad_to_multiple_of
        self._padded_length = padded_length

    def __len__(self) -> int:
        return self._num_samples

    def __getitem__(self, idx: int) -> dict:
        if not 0 <= idx < self._num_samples:
            raise IndexError(f"sample {idx} out of range [0, {self._num_samples})")
        item = self.core[idx]
        length = int(item["tokens"].numel())
        padded = self._padded_length or roundup(length, self._pad_to_multiple_of)
        extra = padded - length
        loss_mask = torch.nn.functional.pad(item["loss_mask"].float(), (0, extra), value=0.0)
        return {
            "tokens": torch.nn.functional.pad(item["tokens"], (0, extra), value=self._pad_id),
            "labels": torch.nn.functional.pad(item["labels"], (0, extra), value=self._pad_id),
            "loss_mask": loss_mask,
            "position_ids": torch.cat([item["position_ids"].long(),
                                       torch.arange(length, padded, dtype=torch.long)]),
            "length": length,
            "padded_length": padded,
            "sample_id": int(idx),
            "num_loss_tokens": int(loss_mask.sum().item()),
        }


def build_core_datasets(config: GPTDatasetConfig, sizes: list[int]) -> list:
    """megatron-core's (train, validation, test) datasets, built on every rank (every rank
    reads samples by index); global rank 0 builds and caches the indices first, and a failure
    on any rank stops every rank in one line (core_builder.py)."""
    return build_in_rank_order(RankLocalBuilder(GPTDataset, sizes, lambda: True, config))


def build_indexed_datasets(data: DataConfig, seq_length: int, seed: int, tokenizer: Tokenizer,
                           pad_to_multiple_of: int, pad_to_seq_length: bool):
    """``(train, validation or None, test or None)`` of the run's indexed data (module
    docstring).

    The checks run first on every rank and agree (:func:`agree_on_errors`); what they cannot
    foresee (an I/O error writing the index cache) fails every rank alike too
    (:func:`build_core_datasets`).
    """
    config = gpt_dataset_config(data, seq_length, seed, tokenizer)
    sizes = split_sizes(data, config)
    if data.full_validation and sizes[Split.valid.value]:
        sizes[Split.valid.value] = whole_split_request(config)
    agree_on_errors(check_indexed_data, config, data, sizes)
    skip_unread_splits(config, sizes)
    print_rank_0(" > datasets target sizes (minimum size):\n    train:      %d\n    "
                 "validation: %d\n    test:       %d", *sizes)
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    train, valid, test = build_core_datasets(config, sizes)
    print_rank_0("> finished creating GPT datasets ...")
    for split, core in ((Split.train, train), (Split.valid, valid), (Split.test, test)):
        check_enough_samples(core, sizes[split.value], split, data)
    if data.eval_samples and valid is None:
        warning_rank_0("no validation data (--valid-data-path): --eval-iters evaluates nothing")
    padded_length = seq_length if pad_to_seq_length else None

    def wrap(core, num_samples):
        return IndexedGPTSamples(core, num_samples, tokenizer.pad, pad_to_multiple_of,
                                 padded_length)

    if data.full_validation and valid is not None:  # all the samples of its one epoch
        sizes[Split.valid.value] = len(valid)
    return tuple(wrap(core, size) if core is not None and size else None
                 for core, size in ((train, sizes[0]), (valid, sizes[1]), (test, sizes[2])))


# megatron-core builds one epoch of a GPT dataset (and of each dataset of an unweighted blend)
# for any request up to it: one sample asks for that epoch, whatever its size.
_ONE_EPOCH_REQUEST = 1


def whole_split_request(config: GPTDatasetConfig) -> int:
    """The validation sample count that makes megatron-core build the whole validation split
    once (--full-validation); a weighted blend, which megatron-core samples to the requested
    count by weight, has no whole split: refused in one line."""
    blend = config.blend if config.blend_per_split is None \
        else config.blend_per_split[Split.valid.value]
    flag = "--data-path" if config.blend_per_split is None else "--valid-data-path"
    # megatron-core builds one weighted --valid-data-path dataset plainly, but blends any
    # weighted --data-path (one dataset included)
    one_plain = config.blend_per_split is not None and blend is not None and len(blend[0]) == 1
    if blend is not None and blend[1] is not None and not one_plain:
        raise ValueError(f"--full-validation with a weighted {flag} blend: megatron-core "
                         f"samples a weighted blend by weight, so it has no whole split to "
                         f"cover; list the datasets without weights or use --eval-iters")
    return _ONE_EPOCH_REQUEST
