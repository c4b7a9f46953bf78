"""``--multiple-validation-sets``: each ``--valid-data-path`` entry is a validation set of its
own, evaluated alone (Megatron-LM's flag; with ``--full-validation``, as Megatron-LM main
requires: each set is read whole). Each set's lines and TensorBoard/wandb keys carry its name,
``--validation-set-names`` or its index: `` validation-wiki loss at iteration N | ...`` and
``lm loss validation-wiki``, as Megatron-LM's ``evaluate_and_print_results``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from megatron.varlen_training.datasets.builder import build_split_datasets
from megatron.varlen_training.errors import agree_on_errors

VALIDATION = "validation"  # Megatron-LM's name of the validation split (its lines and keys)


@dataclasses.dataclass(frozen=True)
class ValidationSets:
    """The providers of the validation sets, each with its name suffix (``-wiki``, ``-0``)."""

    sets: tuple[tuple[str, object], ...]

    def close(self) -> None:
        for _, provider in self.sets:
            provider.close()

    @property
    def datasets(self) -> list:
        return [provider.dataset for _, provider in self.sets]


def set_suffixes(paths: tuple[str, ...], names: tuple[str, ...] | None) -> list[str]:
    """Megatron-LM's suffix of each set: ``-NAME`` (--validation-set-names), else ``-INDEX``."""
    return [f"-{name}" for name in (names or range(len(paths)))]


def build_validation_sets(trainer, make: Callable) -> ValidationSets:
    """Builds each --valid-data-path entry's validation split alone (neither training nor test
    samples) and its provider (``make(dataset)``)."""
    run = trainer.run
    sets = []
    for suffix, path in zip(set_suffixes(run.data.valid_data_path,
                                         run.data.validation_set_names),
                            run.data.valid_data_path):
        data = dataclasses.replace(run.data, valid_data_path=(path,), train_samples=0,
                                   test_samples=0, multiple_validation_sets=False)
        _, valid, _ = agree_on_errors(build_split_datasets, dataclasses.replace(run, data=data),
                                      trainer.tokenizer)
        sets.append((suffix, make(valid)))
    return ValidationSets(tuple(sets))


def datasets_of(provider) -> list:
    """The datasets a provider (or the validation sets) reads."""
    return provider.datasets if isinstance(provider, ValidationSets) else [provider.dataset]


def each_validation_set(valid) -> list[tuple[str, object]]:
    """``(name, provider)`` of every validation set, named as Megatron-LM's lines and keys name
    it: ``validation`` alone, ``validation-wiki``, ... with --multiple-validation-sets."""
    if isinstance(valid, ValidationSets):
        return [(VALIDATION + suffix, provider) for suffix, provider in valid.sets]
    return [(VALIDATION, valid)]
