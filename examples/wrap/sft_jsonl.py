"""Supervised fine-tuning on a JSONL file through ``megatron.wrap`` (CPU, gloo).

    torchrun --nproc-per-node 2 examples/wrap/sft_jsonl.py --steps 10
    python examples/wrap/sft_jsonl.py --steps 4 --override model.num_layers=4

The script reads ``examples/data/sft_tiny.jsonl`` itself and hands raw records
(``{"prompt", "response"}`` or ``{"messages": [...]}``) to the facade: the ``gpt_sft`` flow
tokenizes them with the byte-level tokenizer and the chat template, masks everything but the
assistant text, truncates over-long samples (with a counted warning) and the facade packs the
global batch over the DP ranks. Every rank reads the file and passes the same batch.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from megatron.wrap import MegatronWrap, config_path
from megatron.varlen_training.log import print_rank_0

DATA = Path(__file__).resolve().parents[1] / "data" / "sft_tiny.jsonl"
NUM_HELD_OUT = 4  # the last records of the file are evaluated on, never trained on
# Text needs the byte-level tokenizer; its vocabulary size comes from the tokenizer.
TEXT_OVERRIDES = ["data.tokenizer_type=ByteLevelTokenizer", "model.vocab_size="]


def read_records(path: Path) -> list[dict]:
    """One dict per non-blank line of a JSONL file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def epoch_batches(records: list[dict], batch_size: int, seed: int) -> Iterator[list[dict]]:
    """Global batches of ``batch_size`` records, reshuffled every epoch (same on every rank)."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(records)))
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield [records[i] for i in order[start: start + batch_size]]


def parse_cli(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(config_path("sft_tiny_cpu")))
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--steps", type=int, default=None, help="Default: training.train_iters.")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Config override, e.g. training.global_batch_size=4 (repeatable).")
    parser.add_argument("--save", default=None, help="Save a checkpoint here at the end.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Trains for ``--steps`` steps; returns every step's metrics (the same on every rank)."""
    cli = parse_cli(argv)
    records = read_records(Path(cli.data))
    train_records, held_out = records[:-NUM_HELD_OUT], records[-NUM_HELD_OUT:]
    with MegatronWrap(cli.config, overrides=TEXT_OVERRIDES + cli.override) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        training = wrap.run.training
        steps = cli.steps or training.train_iters
        batches = epoch_batches(train_records, training.global_batch_size, training.seed)
        history = []
        for _ in range(steps):
            history.append(wrap.train(next(batches)))
            wrap.log_last_metrics()
        print_rank_0("held-out loss %.4f", wrap.evaluate(held_out)["loss"])
        if cli.save:
            wrap.save(cli.save)
    return history


if __name__ == "__main__":
    main()
