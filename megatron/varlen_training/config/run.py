"""``RunConfig``: the one configuration a run is built from, one frozen config per component.

Built once, from the validated flags (``config/from_flags.py``: pretrain_gpt.py,
pretrain_mamba.py) or from a ``megatron.wrap`` config tree (the same builders over the same
validation); everything below reads it, never the argparse namespace. The one value that comes
later, the tokenizer's vocabulary size, gives a new RunConfig (:meth:`with_vocabulary`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from megatron.varlen_training.config.checkpoint import CheckpointConfig
from megatron.varlen_training.config.data import DataConfig
from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.config.model import ModelConfig
from megatron.varlen_training.config.optimizer import OptimizerConfig
from megatron.varlen_training.config.packing import SequencePackingConfig
from megatron.varlen_training.config.parallel import ParallelConfig
from megatron.varlen_training.config.runtime import RuntimeConfig
from megatron.varlen_training.config.training import TrainingConfig
from megatron.varlen_training.flag_errors import require
from megatron.varlen_training.run_description import padded_vocab_size


@dataclass(frozen=True)
class RunConfig:
    """The run, component by component.

    Attributes:
        flags: The validated flag values it was built from, ``(argparse dest, value)`` pairs
            (immutable, picklable), for what reports them as given: Megatron-LM's arguments
            dump at start-up and the wandb run's config (:attr:`flag_values`). Code reads the
            typed components, never these.
    """

    model: ModelConfig
    parallel: ParallelConfig
    packing: SequencePackingConfig
    optimizer: OptimizerConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    data: DataConfig
    training: TrainingConfig
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    flags: tuple[tuple[str, Any], ...] = dataclasses.field(default=(), compare=False,
                                                            repr=False)

    @property
    def flag_values(self) -> dict[str, Any]:
        """:attr:`flags` as a dict (a copy)."""
        return dict(self.flags)

    def with_vocabulary(self, tokenizer_vocab_size: int) -> RunConfig:
        """The run once its tokenizer is known: ``--vocab-size`` wins over the tokenizer's
        size, and the padded vocabulary follows (Megatron's rule, run_description.py) unless
        ``--padded-vocab-size`` gave it."""
        model = self.model
        vocab = model.vocab_size if model.vocab_size is not None else tokenizer_vocab_size
        padded = model.padded_vocab_size  # --padded-vocab-size, or already derived from vocab
        if padded is None:
            padded = padded_vocab_size(vocab, model.make_vocab_size_divisible_by,
                                       self.parallel.tensor_model_parallel_size)
        require(padded >= vocab, f"--padded-vocab-size {padded} is smaller than the "
                                 f"tokenizer's vocabulary ({vocab}): every token id needs a row")
        return dataclasses.replace(
            self, model=dataclasses.replace(model, vocab_size=vocab, padded_vocab_size=padded))
