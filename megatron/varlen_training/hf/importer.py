"""Initialise our GPT model chunks from a Hugging Face checkpoint, each rank reading its slices.

Every rank walks the parameters of its own chunks (its PP stage, its VPP chunks) and reads, for
each, only the rows/columns its TP rank holds (``weights.local_shard`` over safetensors slices),
so no rank ever holds the whole model. Parameters the checkpoint lacks, or checkpoint tensors of
the wrong shape, are one-line errors.
"""

from __future__ import annotations

import torch

from megatron.varlen_training.hf import weights
from megatron.varlen_training.hf.config import HFConfigError, HFModelConfig, load_hf_config
from megatron.varlen_training.hf.safetensors_io import SafetensorsReader
from megatron.varlen_training.layout_invariant_init import (
    canonical_parameter_name, stores_gamma_minus_one, tensor_parallel_shard,
)


def _check_shapes(reader: SafetensorsReader, names: list[str], rule: weights.Rule,
                  config: HFModelConfig, tp_size: int, shape) -> None:
    """The HF tensors must have the sizes the flags imply (else the flags and config differ)."""
    if rule.kind == "vocab":
        rows = reader.shape(names[0])[0]
        if rows != config.vocab_size:
            raise HFConfigError(f"{names[0]} has {rows} rows but config.json says vocab_size "
                                f"{config.vocab_size}")
        if shape[0] * tp_size < rows:
            raise HFConfigError(f"the checkpoint's vocabulary of {rows} is larger than the "
                                f"model's {shape[0] * tp_size} (--vocab-size)")


@torch.no_grad()
def load_hf_weights(chunks: list[torch.nn.Module], hf_dir: str, tied_output: bool,
                    config: HFModelConfig | None = None) -> int:
    """Copies the checkpoint's weights into the (unwrapped) model chunks in place.

    Args:
        chunks: This rank's GPT model chunks (one per virtual stage), not DDP-wrapped.
        hf_dir: Hugging Face checkpoint directory.
        tied_output: The model ties its output layer to the word embedding.
        config: The checkpoint's architecture (default: read from ``hf_dir``).

    Returns:
        The number of parameters (tensors) loaded on this rank.
    """
    config = config or load_hf_config(hf_dir)
    reader = SafetensorsReader(hf_dir)
    loaded = 0
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            canonical = canonical_parameter_name(chunk, name, tied_output)
            tp_size, tp_rank = tensor_parallel_shard(name)  # expert TP for routed experts
            rule, names = weights.match(canonical)
            _check_shapes(reader, names, rule, config, tp_size, param.shape)
            shard = weights.local_shard(rule, names, reader.read, tuple(param.shape), config,
                                        tp_size, tp_rank, stores_gamma_minus_one(chunk, name))
            if tuple(shard.shape) != tuple(param.shape):
                raise HFConfigError(
                    f"{', '.join(names)} gives shape {tuple(shard.shape)} for {canonical} but "
                    f"the model expects {tuple(param.shape)}: the flags and config.json differ")
            param.copy_(shard.to(param.dtype))
            loaded += 1
    return loaded
