"""Tiny random Hugging Face models built by ``transformers`` itself from a config (no download).

Shared by the hf tests: the reference side (transformers' own forward) runs in the pytest
process; our side runs in multirank children (see ranks.py).
"""

from __future__ import annotations

import json
import os

# Nothing in these tests may reach the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

VOCAB = 256
SEQ = 16
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
             max_position_embeddings=16384)
# Llama: untied, Llama-3 rope scaling; Qwen2: tied, QKV bias; Qwen3: QK norm, head_dim != h/heads.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True,
                                                      rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=24)),
}
# Built on request only (FAMILIES is what every import/export layout test runs).
OTHER_FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        tie_word_embeddings=False, head_dim=24, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=True)),
}


def build_hf_model(family: str, seed: int = 0, **overrides):
    """A random ``transformers`` model of ``family`` (weights ~ N(0, 0.2) so logits vary)."""
    import transformers

    config_name, model_name, extra = {**FAMILIES, **OTHER_FAMILIES}[family]
    config = getattr(transformers, config_name)(**{**SIZES, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # non-trivial norm weights catch a missed or swapped norm
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
    return model


def save_hf_model(family: str, path: str, **overrides) -> str:
    build_hf_model(family, **overrides).save_pretrained(path)
    return str(path)


@torch.no_grad()
def hf_logits(path: str, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' logits [b, s, V] for ``tokens`` [b, s], fp32, from a saved directory."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()(input_ids=tokens).logits.float()


def sample_tokens(batch: int = 4, seq: int = SEQ, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def model_argv(hf_dir: str, *extra: str) -> list[str]:
    """pretrain_gpt.py flags for a run initialised from ``hf_dir`` (architecture from it)."""
    return ["--hf-checkpoint", str(hf_dir), "--seq-length", str(SEQ), "--micro-batch-size", "2",
            "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--log-interval", "1", "--eval-iters", "0",
            "--seed", "7", *extra]


# Two chat-template styles, written for these tests in the shape of the real ones.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
# style: (template, special tokens, named special tokens)
TOKENIZER_STYLES = {
    "chatml": (CHATML_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
               dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>",
                                 "<|end_header_id|>", "<|eot_id|>"],
               dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
}
TOKENIZER_VOCAB = 320
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello, how are you today?",
          "Packing puts many short samples into one sequence.", "user assistant system"] * 4


def save_tokenizer(style: str, path: str, vocab_size: int = TOKENIZER_VOCAB) -> str:
    """A byte-level BPE tokenizer trained here on a few sentences, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template, specials, named = TOKENIZER_STYLES[style]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=template, **named)
    fast.save_pretrained(path)
    return str(path)


# Mock SFT samples of 4-32 tokens, packed: what the packed HF tests train on (with dynamic CP
# and a budget of 16 tokens per rank, the long ones run on a CP group of 2 ranks).
MOCK_SFT_LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 4,
                               "max_seq_len": 32, "mean_seq_len": 16, "lognormal_sigma": 0.8})
PACKED_SFT = ["--sft", "--sft-mock-dataset-config-json", MOCK_SFT_LENGTHS, "--seq-length", "32",
              "--micro-batch-size", "1", "--global-batch-size", "8", "--sequence-packing"]
DYNAMIC_CP = ["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "16"]
