"""An RL-style loop: batches made at runtime, of varying sizes and lengths, with a custom flow.

    torchrun --nproc-per-node 2 examples/wrap/rl_runtime_loop.py --steps 10
    python examples/wrap/rl_runtime_loop.py --steps 4

Each step, rank 0 plays the rollout worker: it draws prompts and responses of random lengths
(a stand-in for generation), scores them with a toy reward and turns rewards into per-token
advantages. Only rank 0 holds the batch (``source="rank0"``): the facade broadcasts it. The
``reinforce`` flow registered below adds the per-token field ``advantages`` (packed and
CP-split by the facade like the loss mask) and a policy-gradient loss,
``sum(advantage * -log p(token))`` over response tokens, plus the plain NLL as a metric.
"""

from __future__ import annotations

import argparse
import random

import torch

from megatron.wrap import GPTSFTFlow, MegatronWrap, config_path, register_flow

LOSS_KEY = "lm loss"  # the loss name the training path reports
FLOW_NAME = "reinforce"
MIN_PROMPT, MAX_PROMPT = 2, 12
MIN_RESPONSE, MAX_RESPONSE = 1, 24


@register_flow(FLOW_NAME, replace=True)
class ReinforceFlow(GPTSFTFlow):
    """REINFORCE on ``{"prompt_ids", "response_ids", "advantages"}`` samples.

    ``advantages`` holds one value per token of the sample (``len(prompt + response) - 1``);
    only response tokens are trained on (prompt masking of ``gpt_sft``).
    """

    metric_names = (LOSS_KEY, "nll")

    def fields_and_seq_dims(self) -> dict:
        return {**super().fields_and_seq_dims(), "advantages": 0}

    def collate_micro_batch(self, micro_batch: dict) -> tuple[dict, dict]:
        model_inputs, loss_inputs = super().collate_micro_batch(micro_batch)
        loss_inputs["advantages"] = micro_batch["advantages"]
        return model_inputs, loss_inputs

    def loss(self, output: torch.Tensor, loss_inputs: dict):
        nll = output.float().reshape(-1)  # per-token -log p(label), as GPTModel returns it
        mask = loss_inputs["loss_mask"].float().reshape(-1)
        weights = loss_inputs["advantages"].float().reshape(-1) * mask
        pg_sum, nll_sum, count = (nll * weights).sum(), (nll * mask).sum(), mask.sum()
        metrics = {LOSS_KEY: torch.stack([pg_sum.detach(), count]),
                   "nll": torch.stack([nll_sum.detach(), count])}
        return pg_sum, count.to(torch.int), metrics


def toy_reward(response: list[int]) -> float:
    """The share of even ids in the response: the policy learns to prefer even ids."""
    return sum(1 for token in response if token % 2 == 0) / len(response)


def make_rollouts(rng: random.Random, num_samples: int, vocab_size: int) -> list[dict]:
    """Random prompt/response pairs with per-token advantages (reward minus the batch mean)."""
    pairs = []
    for _ in range(num_samples):
        prompt = [rng.randrange(vocab_size - 1) for _ in range(rng.randint(MIN_PROMPT, MAX_PROMPT))]
        response = [rng.randrange(vocab_size - 1)
                    for _ in range(rng.randint(MIN_RESPONSE, MAX_RESPONSE))]
        pairs.append((prompt, response, toy_reward(response)))
    baseline = sum(reward for _, _, reward in pairs) / len(pairs)
    return [{"prompt_ids": prompt, "response_ids": response,
             "advantages": [reward - baseline] * (len(prompt) + len(response) - 1)}
            for prompt, response, reward in pairs]


def parse_cli(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(config_path("rl_runtime_cpu")))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Config override, e.g. model.hidden_size=32 (repeatable).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Runs ``--steps`` steps; returns every step's metrics (the same on every rank)."""
    cli = parse_cli(argv)
    overrides = [f"flow.flow_name={FLOW_NAME}", *cli.override]
    with MegatronWrap(cli.config, overrides=overrides) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        rng = random.Random(wrap.run.training.seed)
        gbs, history = wrap.run.training.global_batch_size, []
        for _ in range(cli.steps):
            # Runtime batch sizes vary; only rank 0 builds the batch, the facade broadcasts it.
            batch = make_rollouts(rng, rng.randint(gbs, 2 * gbs), wrap.run.model.vocab_size) \
                if wrap.rank == 0 else None
            history.append(wrap.train(batch, source="rank0"))
            wrap.log_last_metrics()
    return history


if __name__ == "__main__":
    main()
