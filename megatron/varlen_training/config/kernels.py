"""``KernelConfig``: which megatron-core kernels and implementation the model's TransformerConfig
asks for (Megatron-LM's kernel flags that change what runs here: kernel_arguments.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    """Kernel choices, named as their flags' dests, with Megatron-LM's defaults."""

    bias_dropout_fusion: bool = True
    """False with --no-bias-dropout-fusion; True lets the platform fuse where the kernel gives
    the unfused numbers (megatron.varlen.platform.use_bias_dropout_add_fusion)."""
    cross_entropy_loss_fusion: bool = False
    """megatron-core's fused vocab-parallel cross entropy for the LM loss."""
    cross_entropy_fusion_impl: str = "native"
    """Whose fused cross entropy: megatron-core's (native) or Transformer Engine's (te)."""
    disable_bf16_reduced_precision_matmul: bool = False
    """bf16 CUDA matmuls reduce in full precision (megatron-core sets torch's switch)."""
    transformer_impl: str = "transformer_engine"
    """TransformerConfig.transformer_impl (local or transformer_engine: the same layers here)."""
    moe_permute_fusion: bool = False
    """Transformer Engine's fused MoE token permutation."""
    moe_router_fusion: bool = False
    """Transformer Engine's fused MoE top-k routing."""
