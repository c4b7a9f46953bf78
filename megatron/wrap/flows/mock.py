"""``mock``: random token documents of random lengths, the samples of ``--mock-data --sft``.

:meth:`MockFlow.make_batch` returns global batch ``step`` of the mock SFT dataset that
``pretrain_gpt.py --mock-data --sft`` reads for the same flags (same lengths from
``--sft-mock-dataset-config-json``, same ids from ``--seed``), so a loop over
``wrap.train(wrap.flow.make_batch(step))`` follows the ``pretrain_gpt.py`` trajectory. The loss
is :class:`GPTFlow`'s.
"""

from __future__ import annotations

from megatron.varlen.packing import parse_length_config
from megatron.varlen_training.datasets.mock import MockSFTDataset
from megatron.wrap.flows import fields
from megatron.wrap.flows.gpt import GPTFlow
from megatron.wrap.flows.registry import register_flow


@register_flow("mock")
class MockFlow(GPTFlow):
    """Random samples for smoke tests and benchmarks.

    Args:
        context: The run.
        lengths: A length config as ``--sft-mock-dataset-config-json`` takes it (a dict, JSON
            text or a file); default the config's ``sft_mock_dataset_config_json``.
        seed: Seed of lengths and ids; default the config's ``seed``.
        num_batches: Distinct batches before :meth:`make_batch` refuses; default
            ``train_iters``.
    """

    def __init__(self, context, lengths=None, seed: int | None = None,
                 num_batches: int | None = None):
        super().__init__(context)
        run, tokenizer = context.run, context.tokenizer
        self.batch_size = run.training.global_batch_size
        self.num_batches = num_batches or run.training.train_iters
        config = lengths if lengths is not None else run.data.sft_mock_dataset_config_json
        seq_length = run.model.seq_length
        self._dataset = MockSFTDataset(
            self.num_batches * self.batch_size, seq_length, tokenizer.vocab_size,
            run.training.seed if seed is None else seed, tokenizer.eod,
            parse_length_config(config, seq_length), pad=tokenizer.pad)

    def make_batch(self, step: int) -> list[dict]:
        """Global batch ``step`` (0-based): dataset samples ``step * gbs .. step * gbs + gbs - 1``.

        Raises:
            ValueError: ``step`` is outside ``[0, num_batches)``.
        """
        if not 0 <= step < self.num_batches:
            raise fields.BatchError(f"mock flow: batch {step} is outside [0, {self.num_batches}) "
                             f"(set flow.flow_args.num_batches or training.train_iters)")
        start = step * self.batch_size
        return [self._dataset[i] for i in range(start, start + self.batch_size)]
