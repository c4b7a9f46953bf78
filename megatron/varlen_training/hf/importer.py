"""Initialise our GPT model chunks from a Hugging Face checkpoint, each rank reading its slices.

Every rank walks the parameters of its own chunks (its PP stage, its VPP chunks) and reads, for
each, only the rows/columns its TP rank holds (``weights.local_shard`` over safetensors slices),
so no rank ever holds the whole model. Parameters the checkpoint lacks, or checkpoint tensors of
the wrong shape, are one-line errors. The buffers a checkpoint holds (DeepSeek-V3's router bias,
``weights.MAPPED_BUFFER_SUFFIXES``) are loaded like parameters.

A DeepSeek-V3 checkpoint's MTP layers (``model.layers.<num_hidden_layers + i>.*``) are skipped
with a log line, as transformers' DeepseekV3ForCausalLM skips them: our model's MTP layers
(``--mtp-num-layers``) are not mapped onto them.
"""

from __future__ import annotations

import re

import torch

from megatron.varlen_training.hf import weights
from megatron.varlen_training.hf.config import HFConfigError, HFModelConfig, load_hf_config
from megatron.varlen_training.hf.safetensors_io import SafetensorsReader
from megatron.varlen_training.layout_invariant_init import (
    canonical_parameter_name, stores_gamma_minus_one, tensor_parallel_shard,
)
from megatron.varlen_training.log import print_rank_0

_HF_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")


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
        for name, param in mapped_tensors(chunk):
            canonical = canonical_parameter_name(chunk, name, tied_output)
            tp_size, tp_rank = tensor_parallel_shard(name)  # expert TP for routed experts
            rule, names = weights.match(canonical, mla=config.mla is not None)
            _check_shapes(reader, names, rule, config, tp_size, param.shape)
            shard = weights.local_shard(rule, names, reader.read, tuple(param.shape), config,
                                        tp_size, tp_rank, stores_gamma_minus_one(chunk, name))
            if tuple(shard.shape) != tuple(param.shape):
                raise HFConfigError(
                    f"{', '.join(names)} gives shape {tuple(shard.shape)} for {canonical} but "
                    f"the model expects {tuple(param.shape)}: the flags and config.json differ")
            target = float32_expert_bias(name, param)
            target.copy_(shard.to(target.dtype))
            loaded += 1
    log_skipped_layers(reader.names(), config.num_layers, hf_dir)
    return loaded


def float32_expert_bias(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, switched to float32 first if it is the router's expert bias: megatron-core keeps
    that buffer in float32 (its router switches it back after Float16Module's cast, before loading
    its own state dict and at each forward), so an imported bias is not rounded to bf16 either."""
    if name.endswith(weights.MAPPED_BUFFER_SUFFIXES) and tensor.dtype != torch.float32:
        tensor.data = tensor.data.float()
    return tensor


def mapped_tensors(chunk: torch.nn.Module):
    """``(name, tensor)`` of a chunk's parameters, then of the buffers a checkpoint holds."""
    yield from chunk.named_parameters()
    for name, buffer in chunk.named_buffers():
        if name.endswith(weights.MAPPED_BUFFER_SUFFIXES):
            yield name, buffer


def log_skipped_layers(names, num_layers: int, hf_dir: str) -> list[int]:
    """Says (on rank 0) how many tensors of layers past ``num_layers`` (DeepSeek-V3's MTP
    layers) the import skipped; returns those layers' indices."""
    indices = [int(found.group(1)) for name in names
               if (found := _HF_LAYER_INDEX.match(name)) and int(found.group(1)) >= num_layers]
    if indices:
        layers = sorted(set(indices))
        print_rank_0(f"> skipped {len(indices)} tensors of layers {layers} of {hf_dir} (MTP "
                     f"layers: transformers does not load them either; --mtp-num-layers is "
                     f"not initialised from them)")
    return sorted(set(indices))
