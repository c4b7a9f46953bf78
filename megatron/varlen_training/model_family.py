"""A model family: everything that differs between the GPT models of pretrain_gpt.py and the
hybrid Mamba-Transformers of pretrain_mamba.py, as one value the entry point chooses.

The loop, the data path, checkpoints and metrics are shared; what is not (the chunks, the FLOPs
formula, the scheduler's attention weight, Hugging Face checkpoints) is looked up in the
:class:`ModelFamily` the run was started with, never guessed from which fields a run has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.flops import num_floating_point_operations
from megatron.varlen_training.hf.exporter import save_hf
from megatron.varlen_training.hf.importer import load_hf_weights
from megatron.varlen_training.model import build_model, build_transformer_config
from megatron.varlen_training.window_layers import gpt_attention_layers


@dataclass(frozen=True)
class HFAdapter:
    """How a family's chunks are read from, and written as, a Hugging Face checkpoint.

    Attributes:
        load_weights: ``(chunks, hf_dir, tied_output)``: overwrite the initial weights.
        save: ``(run, chunks, out_dir=None) -> out_dir``: export (every rank calls it).
    """

    load_weights: Callable
    save: Callable


@dataclass(frozen=True)
class ModelFamily:
    """What one kind of model brings to the shared training path.

    Attributes:
        name: How messages name the family.
        model_provider: ``(run) -> (TransformerConfig, DDP-wrapped chunks of this rank)``.
        flops: ``(model config, sum L, sum L^2, windowed sum or None) -> training FLOPs`` of
            one global batch (the windowed sum: window_layers.py).
        attention_layers: ``(model config) -> 1-based layer numbers of its attention layers``,
            the layers whose cost is quadratic: the packing scheduler's cost model weights
            attention by their share and prices those --window-size windows on the window's
            work.
        hf: Its Hugging Face checkpoint adapter, or None (no such checkpoints).
        describe: ``(model config) -> the start-up line`` naming the model, or None for none.
    """

    name: str
    model_provider: Callable
    flops: Callable
    attention_layers: Callable = gpt_attention_layers
    hf: HFAdapter | None = None
    describe: Callable | None = None


GPT_HF = HFAdapter(load_weights=load_hf_weights, save=save_hf)


def gpt_model_provider(run: RunConfig):
    """(config, DDP-wrapped GPT chunks), initialised from ``--hf-checkpoint`` if it is set."""
    config = build_transformer_config(run)
    import_weights = None
    if run.checkpoint.hf_checkpoint:
        import_weights = partial(GPT_HF.load_weights, hf_dir=run.checkpoint.hf_checkpoint,
                                 tied_output=run.model.tied_output)
    return config, build_model(run, config, import_weights=import_weights)


GPT = ModelFamily(name="GPT", model_provider=gpt_model_provider,
                  flops=num_floating_point_operations, hf=GPT_HF)
