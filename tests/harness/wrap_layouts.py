"""The facade (megatron.wrap) on explicit batches, per layout: what a rank runs and returns.

``facade_steps(parallel, flows)`` trains a tiny packed GPT through ``MegatronWrap.train`` for
``NUM_STEPS`` steps on the same fixed global batches (variable lengths, prompts masked, one
fully masked sample) for each flow named, after one ``evaluate()`` of the first batch, and
returns per flow the losses, grad norms and the evaluated loss. A layout is the config's
``parallel`` section; the reference is the same call on one rank (``parallel = {}``).

Flows: ``gpt_sft`` (per-token mean), ``gpt_sft_per_sample`` (``loss_normalization: sample``,
its per-token weight packed like ``loss_mask``), ``test_gpt`` (:class:`GPTFlow` itself) and
``test_token_weights`` (an extra per-token field, fixed pseudo-random weights, used in the loss:
the weighted token sum over the trained-token count), registered when this module is imported.
"""

from __future__ import annotations

import torch

from megatron.wrap import GPTFlow, GPTSFTFlow, MegatronWrap, register_flow

NUM_STEPS = 3
GLOBAL_BATCH = 8
VOCAB = 128
SAMPLE_LENGTHS = (7, 23, 2, 41, 13, 30, 5, 18)  # tokens + 1 (the next-token label)
TOKEN_WEIGHTS = "token_weights"
BASE = {
    "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 64,
              "vocab_size": VOCAB, "make_vocab_size_divisible_by": 32, "hidden_dropout": 0.0,
              "attention_dropout": 0.0, "position_embedding_type": "rope"},
    "training": {"micro_batch_size": 1, "global_batch_size": GLOBAL_BATCH,
                 "train_iters": NUM_STEPS, "lr": 2e-3, "seed": 11, "eval_iters": 0,
                 "log_interval": 1},
    "data": {"tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": [], "progress_bar": False},
}
# flow name in the results: (flow.flow_name, flow.flow_args)
FLOWS = {
    "gpt_sft": ("gpt_sft", {}),
    "gpt_sft_per_sample": ("gpt_sft", {"loss_normalization": "sample"}),
    "test_gpt": ("test_gpt", {}),
    "test_token_weights": ("test_token_weights", {}),
}


class TokenWeightsFlow(GPTSFTFlow):
    """The weighted token sum over the trained tokens: a per-token field the loss reads."""

    def fields_and_seq_dims(self):
        return {**super().fields_and_seq_dims(), TOKEN_WEIGHTS: 0}

    def collate_micro_batch(self, micro_batch):
        model_inputs, loss_inputs = super().collate_micro_batch(micro_batch)
        return model_inputs, {**loss_inputs, TOKEN_WEIGHTS: micro_batch[TOKEN_WEIGHTS]}

    def loss(self, output, loss_inputs):
        mask = loss_inputs["loss_mask"].float().reshape(-1)
        weights = loss_inputs[TOKEN_WEIGHTS].float().reshape(-1)
        loss_sum = torch.sum(output.float().reshape(-1) * weights * mask)
        num_tokens = mask.sum().to(torch.int)
        report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
        return loss_sum, num_tokens, {"lm loss": report}


register_flow("test_gpt", GPTFlow, replace=True)
register_flow("test_token_weights", TokenWeightsFlow, replace=True)


def make_batches(with_weights: bool) -> list[list[dict]]:
    """Fixed global batches in the data-path form: the first third of each sample is prompt
    (masked), sample 2 of every batch fully masked; weights in [0, 2) where asked."""
    generator = torch.Generator().manual_seed(1234)
    batches = []
    for step in range(NUM_STEPS):
        batch = []
        for index, size in enumerate(SAMPLE_LENGTHS):
            size = size + step  # other lengths every step
            ids = torch.randint(1, VOCAB, (size,), generator=generator)
            mask = torch.ones(size - 1, dtype=torch.float32)
            mask[: (size - 1) // 3] = 0
            if index == 2:
                mask[:] = 0
            sample = {"tokens": ids[:-1], "labels": ids[1:], "loss_mask": mask}
            if with_weights:
                sample[TOKEN_WEIGHTS] = 2 * torch.rand(size - 1, generator=generator)
            batch.append(sample)
        batches.append(batch)
    return batches


def facade_steps(parallel: dict, flows: tuple[str, ...]) -> dict:
    """Per flow: {"losses", "grad_norms", "evaluated"} of NUM_STEPS train() calls."""
    out = {}
    for name in flows:
        flow_name, flow_args = FLOWS[name]
        config = {**BASE, "parallel": {"sequence_packing": True, **parallel},
                  "flow": {"flow_name": flow_name, "flow_args": flow_args}}
        batches = make_batches(with_weights=name == "test_token_weights")
        with MegatronWrap(config) as wrap:
            wrap.initialize().setup_model_and_optimizer()
            evaluated = wrap.evaluate(batches[0])["loss"]
            steps = [wrap.train(batch) for batch in batches]
        out[name] = {"losses": [s["loss"] for s in steps],
                     "grad_norms": [s["grad_norm"] for s in steps], "evaluated": evaluated}
    return out
