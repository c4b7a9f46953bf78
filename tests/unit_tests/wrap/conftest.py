"""Fixtures for the megatron.wrap tests: a fake pretrain_gpt.py parser and config trees."""

import argparse
import textwrap
from pathlib import Path

import pytest

from megatron.wrap.config import known_keys_from_parser

STORE_TRUE_KEYS = (
    "group_query_attention", "swiglu", "disable_bias_linear",
    "untie_embeddings_and_output_weights", "sequence_parallel", "use_distributed_optimizer",
    "mock_data", "sft", "bf16", "fp16", "calculate_per_token_loss", "sequence_packing",
    "dynamic_context_parallel",
)
INT_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "seq_length", "max_position_embeddings", "micro_batch_size", "global_batch_size",
    "train_iters", "lr_warmup_iters", "seed", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
    "context_parallel_size", "vocab_size", "log_interval", "eval_interval", "eval_iters",
    "save_interval", "max_seqlen_per_dp_cp_rank", "min_dynamic_context_parallel_size",
    "mtp_num_layers",
)
FLOAT_KEYS = (
    "lr", "min_lr", "weight_decay", "clip_grad", "adam_beta1", "adam_beta2", "hidden_dropout",
    "attention_dropout", "init_method_std",
)
STR_KEYS = (
    "tokenizer_model", "save", "load", "log_metrics_jsonl", "sft_mock_dataset_config_json",
)
CHOICE_KEYS = {
    "position_embedding_type": ("learned_absolute", "rope", "none"),
    "normalization": ("LayerNorm", "RMSNorm"),
    "lr_decay_style": ("constant", "linear", "cosine", "inverse-square-root", "WSD"),
    "sequence_packing_scheduler": ("dp_balanced", "default", "empty", "default_dynamic_cp"),
    "tokenizer_type": ("NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer"),
}
LIST_KEYS = ("data_path",)
"""With the store_true, int, float, str and choice keys: exactly the CLI keys the shipped
configs may use (Megatron-LM argparse dests)."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def build_library_parser() -> argparse.ArgumentParser:
    """A stand-in for pretrain_gpt.py's parser that knows exactly the library's keys."""
    parser = argparse.ArgumentParser(prog="fake_pretrain_gpt", exit_on_error=False)
    for dest in STORE_TRUE_KEYS:
        parser.add_argument(_flag(dest), action="store_true")
    for dest in INT_KEYS:
        parser.add_argument(_flag(dest), type=int)
    for dest in FLOAT_KEYS:
        parser.add_argument(_flag(dest), type=float)
    for dest in STR_KEYS:
        parser.add_argument(_flag(dest), type=str)
    for dest, choices in CHOICE_KEYS.items():
        parser.add_argument(_flag(dest), choices=choices)
    for dest in LIST_KEYS:
        parser.add_argument(_flag(dest), nargs="*")
    return parser


@pytest.fixture
def library_parser() -> argparse.ArgumentParser:
    return build_library_parser()


@pytest.fixture
def known_keys() -> dict:
    """`{dest: default}` of the fake parser."""
    return known_keys_from_parser(build_library_parser())


@pytest.fixture
def write_configs(tmp_path):
    """Writes `{relative path: yaml text}` under a fresh configs root and returns the root."""

    def write(files: dict[str, str]) -> Path:
        for relative, text in files.items():
            path = tmp_path / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return tmp_path

    return write
