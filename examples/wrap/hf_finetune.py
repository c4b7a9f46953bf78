"""Fine-tune a Hugging Face model on the shipped JSONL through ``megatron.wrap``, packed, with
dynamic context parallelism, and hand back a Hugging Face checkpoint.

    python examples/wrap/hf_finetune.py --steps 5 --out /tmp/hf_finetuned
    torchrun --nproc-per-node 2 examples/wrap/hf_finetune.py --hf-dir MY_QWEN2_DIR --out OUT

``--hf-dir`` is a local Llama/Qwen2/Qwen3 checkpoint with its tokenizer files (chat template).

Without ``--hf-dir`` the script first creates a tiny random Qwen2-style model and a byte-level
BPE tokenizer with a ChatML chat template (trained on the JSONL's own text), with
``transformers`` and ``tokenizers``: nothing is downloaded. Conversations are rendered with the
tokenizer's chat template and only assistant tokens are trained on. The result in ``--out``
loads with ``transformers.AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

import torch.distributed as dist

from megatron.wrap import MegatronWrap
from megatron.varlen_training.log import print_rank_0

DATA = Path(__file__).resolve().parents[1] / "data" / "sft_tiny.jsonl"
NUM_HELD_OUT = 4  # the last records of the file are evaluated on, never trained on
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TINY_TOKENIZER_VOCAB = 512
SEQ_LENGTH = 256
TINY_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True)
# Training settings; the model (and tokenizer) come from the checkpoint directory.
CONFIG = {
    "__select__": {"parallel": "single", "optimizer": "adam_cosine", "logging": "console"},
    "model": {"seq_length": SEQ_LENGTH},
    "training": {"micro_batch_size": 1, "global_batch_size": 8, "train_iters": 10,
                 "seed": 1234},
    # Each rank holds SEQ_LENGTH / world tokens per micro-batch (set in main): a long
    # conversation runs on a CP group of several ranks, a short one on one rank.
    "parallel": {"dynamic_context_parallel": True},
    "flow": {"flow_name": "gpt_sft"},
}


def read_records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _texts(records: list[dict]) -> list[str]:
    texts = []
    for record in records:
        texts += [m["content"] for m in record.get("messages", [])]
        texts += [record[k] for k in ("prompt", "response") if k in record]
    return texts


def create_tiny_hf_model(out_dir: str, records: list[dict], seed: int = 0) -> str:
    """A random Qwen2-style model and a ChatML tokenizer trained on ``records``' text."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(_texts(records), trainers.BpeTrainer(
        vocab_size=TINY_TOKENIZER_VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                         "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, chat_template=CHATML, eos_token="<|im_end|>",
        pad_token="<|endoftext|>")
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=len(hf_tokenizer), **TINY_MODEL)
    transformers.Qwen2ForCausalLM(config).save_pretrained(out_dir)
    hf_tokenizer.save_pretrained(out_dir)
    return out_dir


def _shared_tiny_model(records: list[dict], where: str | None) -> str:
    """Rank 0 creates the tiny model (in ``where``, default a new temporary directory); every
    rank gets its directory."""
    path = [None]
    if dist.get_rank() == 0:
        path[0] = create_tiny_hf_model(where or tempfile.mkdtemp(prefix="tiny_hf_"), records)
    dist.broadcast_object_list(path, src=0)
    return path[0]


def epoch_batches(records: list[dict], batch_size: int, seed: int):
    rng = random.Random(seed)
    while True:
        order = list(range(len(records)))
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield [records[i] for i in order[start: start + batch_size]]


def parse_cli(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf-dir", default=None, help="Default: create a tiny model.")
    parser.add_argument("--tiny-dir", default=None,
                        help="Where to create the tiny model (default: a temporary directory).")
    parser.add_argument("--out", default=None, help="Write the fine-tuned HF checkpoint here.")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--steps", type=int, default=None, help="Default: training.train_iters.")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Config override, e.g. training.global_batch_size=4 (repeatable).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Fine-tunes; returns the held-out loss before/after, every step's metrics and the dirs."""
    cli = parse_cli(argv)
    records = read_records(Path(cli.data))
    train_records, held_out = records[:-NUM_HELD_OUT], records[-NUM_HELD_OUT:]
    if not dist.is_initialized():
        from megatron.varlen_training.initialize import initialize_distributed

        initialize_distributed()
    hf_dir = cli.hf_dir or _shared_tiny_model(records, cli.tiny_dir)
    budget = f"parallel.max_seqlen_per_dp_cp_rank={SEQ_LENGTH // dist.get_world_size()}"
    with MegatronWrap.from_pretrained(hf_dir, CONFIG, overrides=[budget, *cli.override]) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        before = wrap.evaluate(held_out)["loss"]
        training = wrap.run.training
        batches = epoch_batches(train_records, training.global_batch_size, training.seed)
        history = []
        for _ in range(cli.steps or training.train_iters):
            history.append(wrap.train(next(batches)))
            wrap.log_last_metrics()
        after = wrap.evaluate(held_out)["loss"]
        print_rank_0("held-out loss %.4f -> %.4f", before, after)
        out = wrap.save_pretrained(cli.out) if cli.out else None
    return {"before": before, "after": after, "history": history, "hf_dir": hf_dir,
            "out": out, "held_out": held_out}


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
