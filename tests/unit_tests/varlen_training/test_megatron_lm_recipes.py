"""Megatron-LM's own example recipes, run through this fork's parser: a user who brings one gets
the same run, or one line naming each flag that cannot mean the same here -- never argparse's
"unrecognized arguments".

The command lines below are the flags of Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh and
examples/mamba/train.sh (Megatron-LM main d98e8a6), written out here with their values; only the
sizes are shrunk (the parse never builds the model), the paths point into a temporary folder
and the data flags become mock data (the recipes' tokenizers need files that a parse-only test
does not have; their flags are still checked to be known). REFUSED lists, per recipe, the flags
this fork refuses in one line: the test shows each one refused alone and the rest accepted.
"""

from __future__ import annotations

import pytest
import torch

from megatron.varlen_training.arguments import build_parser
from megatron.varlen_training.config.from_flags import parse_hybrid_run_config, parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser

MOCK_DATA = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]
# The data and tokenizer flags of the recipes, replaced by MOCK_DATA in the parse (known only).
DATA_FLAGS = {"--data-path", "--vocab-file", "--merge-file", "--tokenizer-type",
              "--tokenizer-model", "--vocab-size", "--split", "--data-cache-path",
              "--mock-data", "--tiktoken-pattern", "--no-mmap-bin-files", "--num-workers"}


def _gpt3_175b(tmp: str) -> list[str]:
    return [
        "--num-layers", "16", "--hidden-size", "64", "--num-attention-heads", "8",
        "--seq-length", "64", "--max-position-embeddings", "64", "--attention-backend", "auto",
        "--micro-batch-size", "1", "--global-batch-size", "16",
        "--step-batch-size-schedule", "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536",
        "--train-iters", "500000", "--weight-decay", "0.1", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad", "1.0", "--fp16",
        "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
        "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000",
        "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
        "--data-path", f"{tmp}/data_text_document", "--vocab-file", f"{tmp}/gpt2-vocab.json",
        "--merge-file", f"{tmp}/gpt2-merges.txt", "--split", "949,50,1",
        "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000",
        "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt", "--eval-iters", "10",
        "--tensorboard-dir", f"{tmp}/tb",
    ]


def _llama3_8b(tmp: str) -> list[str]:
    return [
        "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64",
        "--ffn-hidden-size", "224", "--num-attention-heads", "4", "--group-query-attention",
        "--num-query-groups", "2", "--kv-channels", "16", "--seq-length", "64",
        "--max-position-embeddings", "64", "--position-embedding-type", "rope",
        "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0", "--swiglu", "--normalization", "RMSNorm",
        "--init-method-std", "0.0134", "--attention-backend", "fused", "--apply-layernorm-1p",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--micro-batch-size", "1", "--global-batch-size", "8",
        "--train-samples", "1953125000", "--lr-decay-samples", "1949218748",
        "--lr-warmup-samples", "3906252", "--lr", "0.00015", "--min-lr", "0.00001",
        "--decoupled-lr", "5.0e-4", "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine",
        "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16",
        "--cross-entropy-loss-fusion", "--calculate-per-token-loss", "--manual-gc",
        "--empty-unused-memory-level", "1", "--exit-duration-in-mins", "235",
        "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
        "--fp8-amax-compute-algo", "max", "--fp8-param-gather",
        "--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
        "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512",
        "--data-cache-path", f"{tmp}/cache", "--tiktoken-pattern", "v2", "--split", "99,1,0",
        "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1",
        "--log-interval", "1", "--eval-iters", "32", "--eval-interval", "100",
        "--save-interval", "1000", "--log-throughput", "--profile", "--profile-step-start", "4",
        "--profile-step-end", "6", "--ckpt-format", "torch_dist",
        "--distributed-timeout-minutes", "60", "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt",
        "--tensorboard-dir", f"{tmp}/tb",
    ]


def _mixtral_8x7b(tmp: str) -> list[str]:
    return [
        "--use-mcore-models", "--disable-bias-linear", "--seq-length", "64",
        "--max-position-embeddings", "128", "--num-layers", "4", "--hidden-size", "64",
        "--ffn-hidden-size", "224", "--num-attention-heads", "4", "--init-method-std", "0.01",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--swiglu", "--untie-embeddings-and-output-weights",
        "--group-query-attention", "--num-query-groups", "2", "--no-masked-softmax-fusion",
        "--no-position-embedding", "--rotary-base", "1000000", "--num-experts", "8",
        "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
        "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
        "alltoall", "--overlap-param-gather", "--overlap-grad-reduce",
        "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", f"{tmp}/tokenizer.model",
        "--data-path", f"{tmp}/data_text_document", "--split", "99990,8,2",
        "--micro-batch-size", "1", "--global-batch-size", "16", "--lr", "1e-4",
        "--train-iters", "500000", "--lr-decay-iters", "320000", "--lr-decay-style", "cosine",
        "--min-lr", "1.0e-5", "--weight-decay", "0.1", "--lr-warmup-iters", "500",
        "--clip-grad", "1.0", "--bf16", "--tensor-model-parallel-size", "1",
        "--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "8",
        "--use-distributed-optimizer", "--sequence-parallel", "--log-interval", "1",
        "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10",
        "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt", "--tensorboard-dir", f"{tmp}/tb",
        "--no-load-optim", "--no-load-rng", "--wandb-project", "Mixtral",
        "--wandb-exp-name", "Mixtral_8x7B",
    ]


def _mamba(tmp: str) -> list[str]:
    return [
        "--tensor-model-parallel-size", "2", "--sequence-parallel",
        "--pipeline-model-parallel-size", "1", "--use-distributed-optimizer",
        "--overlap-param-gather", "--overlap-grad-reduce", "--untie-embeddings-and-output-weights",
        "--init-method-std", "0.02", "--position-embedding-type", "none",
        "--hybrid-layer-pattern", "M*M-", "--num-layers", "4", "--hidden-size", "256",
        "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "2",
        "--seq-length", "64", "--max-position-embeddings", "64", "--train-samples", "1000",
        "--lr-warmup-samples", "10", "--lr-decay-samples", "900", "--save", f"{tmp}/ckpt",
        "--load", f"{tmp}/ckpt", "--data-path", f"{tmp}/data_text_document",
        "--data-cache-path", f"{tmp}/cache", "--split", "99,1,0",
        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
        f"{tmp}/tokenizer.model", "--distributed-backend", "gloo", "--micro-batch-size", "4",
        "--global-batch-size", "8", "--lr", "2.5e-4", "--min-lr", "2.5e-5",
        "--lr-decay-style", "cosine", "--weight-decay", "0.1", "--clip-grad", "1.0",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--disable-bias-linear",
        "--normalization", "RMSNorm", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
        "--log-interval", "10", "--save-interval", "2000", "--eval-interval", "2000",
        "--eval-iters", "32", "--bf16", "--use-mcore-models",
        "--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec",
        "--no-create-attention-mask-in-dataloader", "--tensorboard-dir", f"{tmp}/tb",
    ]


_FP8 = "FP8 needs Transformer Engine's FP8 layers, not built here"
# recipe -> (its command line, world size for the parse, the flags refused here and why)
RECIPES = {
    "gpt3_175b": (_gpt3_175b, 128, {
        "--fp16": "the fp16 loss scaler is CUDA-only",
        "--step-batch-size-schedule": "main's batch-size schedule: the global batch is fixed"}),
    "llama3_8b": (_llama3_8b, 8, {
        "--attention-backend": "fused is Transformer Engine's cuDNN kernel (te here): needs TE",
        "--fp8-format": _FP8, "--fp8-amax-history-len": _FP8, "--fp8-amax-compute-algo": _FP8,
        "--fp8-param-gather": _FP8,
        "--profile": "without --use-pytorch-profiler it opens nsys's CUDA capture range"}),
    "mixtral_8x7b": (_mixtral_8x7b, 32, {}),
    "mamba": (_mamba, 4, {}),
}
# Refused on this machine only: accepted where CUDA is (the same parse on a GPU).
CPU_ONLY = {"--fp16", "--profile"}
HYBRID = {"mamba"}


def _parser(name: str):
    return build_hybrid_parser() if name in HYBRID else build_parser()


def _parse(name: str, argv: list[str], world: int):
    if name in HYBRID:
        return parse_hybrid_run_config(argv, world_size=world)
    return parse_run_config(argv, world_size=world)


def _flags(argv: list[str]) -> list[str]:
    return [token for token in argv if token.startswith("--")]


def _without(argv: list[str], drop: set[str]) -> list[str]:
    """``argv`` without the flags ``drop`` and their values."""
    kept, skipping = [], False
    for token in argv:
        if token.startswith("--"):
            skipping = token in drop
        if not skipping:
            kept.append(token)
    return kept


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_flag_of_the_recipe_is_known(name, tmp_path):
    known = {option for action in _parser(name)._actions for option in action.option_strings}
    recipe = RECIPES[name][0](str(tmp_path))
    assert [flag for flag in _flags(recipe) if flag not in known] == []


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_recipe_parses_without_its_refused_flags(name, tmp_path):
    """The recipe less REFUSED parses (the same run); each refused flag put back alone stops
    the parse with one line naming it."""
    make, world, refused = RECIPES[name]
    if torch.cuda.is_available():
        refused = {flag: why for flag, why in refused.items() if flag not in CPU_ONLY}
    recipe = _without(make(str(tmp_path)), DATA_FLAGS) + MOCK_DATA
    _parse(name, _without(recipe, set(refused)), world)
    for flag in refused:
        with pytest.raises(ArgumentValidationError) as err:
            _parse(name, _without(recipe, set(refused) - {flag}), world)
        assert flag in str(err.value) and "\n" not in str(err.value), str(err.value)
