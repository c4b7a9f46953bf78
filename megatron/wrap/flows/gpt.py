"""GPT next-token flows: the model call and loss of ``pretrain_gpt.py``, by calling its code.

:class:`GPTFlow` feeds the packed micro-batch to the GPT model exactly as
``megatron.varlen_training.training.forward_step`` does and scores it with that module's
``loss_func`` (sum of masked token losses and their count), so a flow built on it trains the
same trajectory as ``pretrain_gpt.py`` on the same samples.
"""

from __future__ import annotations

import torch

from megatron.varlen_training.training import loss_func
from megatron.wrap.flows.base import Flow


class GPTFlow(Flow):
    """Next-token cross entropy on ``labels`` where ``loss_mask`` is 1 (per-token mean).

    A fully masked sample adds 0 to the loss sum and 0 to the count: never a NaN.
    """

    def collate_micro_batch(self, micro_batch: dict) -> tuple[dict, dict]:
        # The keywords of GPTModel.forward; training.forward_step passes the same values.
        model_inputs = {
            "input_ids": micro_batch["tokens"],
            "position_ids": micro_batch["position_ids"],
            "attention_mask": None,  # THD packs: causal masking per sequence, from cu_seqlens
            "labels": micro_batch["labels"],
            "packed_seq_params": micro_batch.get("packed_seq_params"),
            "loss_mask": micro_batch["loss_mask"],
            "padding_mask": micro_batch.get("padding_mask"),  # True where no real token
        }
        return model_inputs, {"loss_mask": micro_batch["loss_mask"]}

    def loss(self, output: torch.Tensor, loss_inputs: dict):
        """``training.loss_func``: ``(sum, count, {"lm loss": [sum, count]})``."""
        return loss_func(loss_inputs["loss_mask"], output)
