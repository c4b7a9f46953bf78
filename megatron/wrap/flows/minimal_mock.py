"""``minimal_mock``: megatron-wrap's smoke-test flow: every sample, whatever it holds, becomes
random token ids of a random length.

megatron-wrap's ``minimal_mock`` feeds random ids (length a multiple of 4 up to a quarter of
``seq_length``) and trains the max logit towards 1 with an MSE loss, only to exercise the
machinery. This one keeps the inputs (any sample, e.g. its ``EmptyDataset``'s ``[index]``, is
replaced by random ids of such a length) and uses :class:`GPTFlow`'s next-token loss, so the
numbers mean something. Ids depend only on ``seed``, the batch number and the sample index, so
every rank builds the same batch. It reads no field of any sample, by design (the samples only
count), so the rule that an unread field is an error (``Flow.refuse_unread``) does not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from megatron.varlen_training.datasets.sample import make_sample
from megatron.wrap.flows.gpt import GPTFlow
from megatron.wrap.flows.registry import register_flow

LENGTH_QUANTUM = 4  # megatron-wrap's mock lengths are multiples of 4 ...
LENGTH_FRACTION = 4  # ... up to seq_length / 4
SEED_MASK = (1 << 63) - 1  # torch.Generator seeds are non-negative 64-bit


@register_flow("minimal_mock")
class MinimalMockFlow(GPTFlow):
    """Random samples in place of whatever the batch holds (module docstring).

    Args:
        context: The run.
        seed: Seed of lengths and ids; default the config's ``seed``.
    """

    def __init__(self, context, seed: int | None = None):
        super().__init__(context)
        self.seed = context.run.training.seed if seed is None else int(seed)
        self.num_batches = 0

    def build_samples(self, batch: Sequence) -> list[dict]:
        samples = [self._random_sample(index) for index in range(len(batch))]
        self.num_batches += 1
        return samples

    def _random_sample(self, index: int) -> dict:
        # hash of a tuple of ints: the same in every process (no PYTHONHASHSEED salt)
        generator = torch.Generator().manual_seed(
            hash((self.seed, self.num_batches, index)) & SEED_MASK)
        longest = max(1, min(self.context.max_length,
                             self.context.run.model.seq_length // LENGTH_FRACTION)
                      // LENGTH_QUANTUM)
        length = LENGTH_QUANTUM * int(torch.randint(1, longest + 1, (1,), generator=generator))
        length = min(length, self.context.max_length)
        ids = torch.randint(0, self.context.run.model.vocab_size, (length + 1,),
                            generator=generator)
        made = make_sample(ids.numpy(), None, index, self.context.tokenizer.pad)
        sample = {key: made[key][:length] for key in ("tokens", "labels", "loss_mask")}
        sample["length"] = length
        return sample
