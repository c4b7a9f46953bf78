"""The forward step megatron-core's schedule calls, built from a flow.

``Trainer.step(batches, forward_step_func=FlowForwardStep(flow))`` runs the training
path's one optimizer step with the flow's model inputs and loss. The loss closure also keeps
each micro-batch's metrics, so the facade can reduce the flow's extra metrics like the loss.
"""

from __future__ import annotations

from functools import partial

import torch

from megatron.varlen_training.training import LOSS_KEY


class FlowForwardStep:
    """``forward_step_func(data_iterator, model)`` for megatron-core, from a flow.

    Args:
        flow: A :class:`megatron.wrap.flows.Flow`.

    Attributes:
        records: ``{name: tensor([sum, count])}`` per micro-batch scored since :meth:`reset`
            (only the last pipeline stage scores).
    """

    def __init__(self, flow):
        self.flow = flow
        self.records: list[dict] = []

    def reset(self) -> None:
        """Forgets the records of the previous step."""
        self.records = []

    def __call__(self, data_iterator, model):
        micro_batch = next(data_iterator)
        model_inputs, loss_inputs = self.flow.collate_micro_batch(micro_batch)
        output = model(**model_inputs)
        return output, partial(self._loss, loss_inputs)

    def _loss(self, loss_inputs: dict, output: torch.Tensor):
        loss_sum, num_tokens, metrics = self.flow.loss(output, loss_inputs)
        required = dict.fromkeys((LOSS_KEY, *self.flow.metric_names))
        missing = [name for name in required if name not in metrics]
        if missing:
            raise ValueError(f"flow {self.flow.name!r}: loss() must report {LOSS_KEY!r} and "
                             f"every name of metric_names; missing {missing}")
        self.records.append({name: metrics[name].detach() for name in self.flow.metric_names})
        return loss_sum, num_tokens, metrics
