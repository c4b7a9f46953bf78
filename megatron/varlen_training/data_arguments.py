"""Megatron-LM's indexed-data flags (``--split``, per-split paths, the index cache, mmap,
``--num-workers``) and
the syntax checks of ``--data-path`` blends, in one group.

What the flags select is read by :mod:`megatron.varlen_training.datasets.indexed` (through
megatron-core's ``BlendedMegatronDatasetBuilder``); here only what the command line alone can
tell is checked: a blend list that does not parse, a ``--split`` that is not a split, and flag
combinations Megatron-LM refuses. File checks come at start-up, on every rank
(:mod:`megatron.varlen_training.datasets.indexed_checks`).
"""

from __future__ import annotations

import argparse
import math
import os
import re

from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.refused_flags import dest_of

# Megatron-LM's "legacy default" when --data-path comes without --split (train, valid, test).
DEFAULT_SPLIT = "969, 30, 1"
SPLIT_PARTS = 3  # train, validation, test
DEFAULT_NUM_WORKERS = 2  # Megatron-LM's --num-workers
PER_SPLIT_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")
_SPLIT_SEPARATORS = re.compile(r"[,/]")


def add_indexed_data_args(parser) -> None:
    """Registers Megatron-LM's indexed-data flags on ``parser`` (``--data-path`` itself is in
    arguments.py's data group)."""
    group = parser.add_argument_group("indexed data (Megatron-LM's .bin/.idx datasets)")
    group.add_argument("--split", default=None,
                       help="Train, validation, test shares of every --data-path dataset's "
                            f"documents, e.g. '98,2,0' (default '{DEFAULT_SPLIT}', as "
                            "Megatron-LM); with --sft, of the file's samples (default: the "
                            "last 5 percent validate).")
    for flag, name in zip(PER_SPLIT_FLAGS, ("training", "validation", "test")):
        group.add_argument(flag, nargs="+", default=None, metavar="[WEIGHT] PREFIX",
                           help=f"The {name} split's own datasets (prefixes, optionally "
                                f"weighted like --data-path) instead of --data-path/--split.")
    group.add_argument("--data-cache-path", default=None,
                       help="Directory for megatron-core's cached sample indices (default: "
                            "beside each dataset, PREFIX/cache/GPTDataset_indices).")
    group.add_argument("--mmap-bin-files", action=argparse.BooleanOptionalAction, default=True,
                       help="Memory-map the .bin files (--no-mmap-bin-files: read them with "
                            "file reads).")
    group.add_argument("--num-workers", type=int, default=DEFAULT_NUM_WORKERS,
                       help="DataLoader worker processes reading the training samples of "
                            "indexed data ahead of each step (0: read in the training process; "
                            "the samples do not depend on it).")


def parse_blend(entries: list[str], flag: str) -> tuple[list[str], list[float] | None]:
    """``PREFIX ...`` or ``WEIGHT PREFIX WEIGHT PREFIX ...`` -> (prefixes, weights or None).

    Megatron-LM's rule (megatron-core's ``get_blend_from_list``): an odd count is a list of
    prefixes; an even count whose every other entry, from the first, is a number is a weighted
    blend. Anything in between is refused here, in one line naming ``flag`` and the entry,
    rather than read as a prefix named like a number. So is a prefix named twice
    (:func:`_refuse_repeated_prefix`).

    Raises:
        ValueError: one line naming ``flag``, the entry and what was expected.
    """
    numbers = [_as_number(entry) for entry in entries[::2]]
    if len(entries) % 2 == 1 or all(number is None for number in numbers):
        if len(entries) > 1 and numbers[0] is not None:
            raise ValueError(f"{flag}: {len(entries)} entries, but a weighted blend is pairs "
                             f"'WEIGHT PREFIX' (entry 1 {entries[0]!r} is a weight)")
        _refuse_repeated_prefix(list(entries), None, flag)
        return list(entries), None
    for position, (entry, number) in enumerate(zip(entries[::2], numbers)):
        if number is None or not math.isfinite(number) or number < 0:
            raise ValueError(f"{flag}: entry {2 * position + 1} {entry!r} is not a weight (a "
                             f"finite number > 0 before each prefix, as in "
                             f"'{flag} 0.7 PREFIX_A 0.3 PREFIX_B')")
        if number == 0:  # megatron-core's BlendedDataset asserts every weight > 0 (a traceback)
            raise ValueError(f"{flag}: entry {2 * position + 1} gives "
                             f"{entries[2 * position + 1]!r} a weight of 0, but megatron-core "
                             f"blends only datasets with weights > 0: leave it out of {flag}")
    _refuse_repeated_prefix(list(entries[1::2]), numbers, flag)
    return list(entries[1::2]), numbers


def _refuse_repeated_prefix(prefixes: list[str], weights: list[float] | None, flag: str) -> None:
    """A dataset named twice in one blend is refused: megatron-core builds one dataset per
    entry, and both copies of a prefix get the same sample order (the same seed, split and
    cache), so the blend reads each of its first samples twice and never its later ones --
    not the upsampling a doubled weight gives."""
    keys = [os.path.normpath(os.path.abspath(prefix)) for prefix in prefixes]
    step = 1 if weights is None else 2  # entry numbers (1-based) as the user typed them
    for position, key in enumerate(keys):
        first = keys.index(key)
        if first == position:
            continue
        fix = "name it once" if weights is None else (
            f"name it once with the weights summed "
            f"({sum(w for k, w in zip(keys, weights) if k == key):g})")
        raise ValueError(f"{flag}: entry {(position + 1) * step} {prefixes[position]!r} names "
                         f"the dataset of entry {(first + 1) * step} again: megatron-core would "
                         f"build it twice with the same sample order and read its first samples "
                         f"twice each; {fix}")


def _as_number(entry: str) -> float | None:
    try:
        return float(entry)
    except ValueError:
        return None


def parse_split(split: str) -> list[float]:
    """``'969, 30, 1'`` -> the three shares (missing trailing parts are 0), as megatron-core
    reads them.

    Raises:
        ValueError: one line naming ``--split`` and the value.
    """
    parts = [part.strip() for part in _SPLIT_SEPARATORS.split(split)]
    shares = [_as_number(part) for part in parts]
    if not 1 <= len(parts) <= SPLIT_PARTS or any(
            share is None or not math.isfinite(share) or share < 0 for share in shares):
        raise ValueError(f"--split {split!r} is not a split: give 1 to {SPLIT_PARTS} "
                         f"comma-separated shares >= 0 (train, validation, test), e.g. '98,2,0'")
    if sum(shares) <= 0:
        raise ValueError(f"--split {split!r} gives every split a share of 0")
    return shares + [0.0] * (SPLIT_PARTS - len(shares))


def uses_indexed_data(args) -> bool:
    """Whether the run reads Megatron indexed datasets (neither mock nor SFT data)."""
    has_paths = args.data_path is not None or args.train_data_path is not None
    return has_paths and not args.mock_data and not args.sft


def validate_indexed_data_args(args, require) -> None:
    """Checks the blends and the split; resolves ``--split``'s default (Megatron-LM's)."""
    per_split = [getattr(args, dest_of(flag, {})) for flag in PER_SPLIT_FLAGS]
    _refuse_paths_with_mock_data(args, per_split, require)
    if not uses_indexed_data(args):
        require(all(paths is None for paths in per_split),
                "--train-data-path/--valid-data-path/--test-data-path name indexed (.bin/.idx) "
                "datasets: they do not go with --sft")
        return
    if any(paths is not None for paths in per_split):
        require(args.data_path is None,
                "--data-path and --train-data-path/--valid-data-path/--test-data-path are "
                "alternatives: give one split by --split, or each split its own datasets")
        require(args.split is None,
                f"--split {args.split!r} splits --data-path; with --train-data-path/"
                "--valid-data-path/--test-data-path each split has its own datasets")
        for flag, paths in zip(PER_SPLIT_FLAGS, per_split):
            if paths is not None:
                _check_blend(paths, flag, require)
        return
    _check_blend(args.data_path, "--data-path", require)
    if args.split is None:
        warning_rank_0("Please specify --split when using --data-path. Using legacy default "
                       "value of \"%s\"", DEFAULT_SPLIT)
        args.split = DEFAULT_SPLIT
    try:
        parse_split(args.split)
    except ValueError as err:
        require(False, str(err))


def _refuse_paths_with_mock_data(args, per_split: list, require) -> None:
    """--mock-data makes its samples up: data paths beside it would not be read (Megatron-LM
    ignores them without a word)."""
    if not args.mock_data:
        return
    flags = [("--data-path", args.data_path), *zip(PER_SPLIT_FLAGS, per_split)]
    for flag, paths in flags:
        require(paths is None,
                f"--mock-data makes its samples up, so {flag} {' '.join(paths or [])} would not "
                f"be read: drop --mock-data to train on the data, or drop {flag}")


def _check_blend(entries: list[str], flag: str, require) -> None:
    try:
        parse_blend(entries, flag)
    except ValueError as err:
        require(False, str(err))
