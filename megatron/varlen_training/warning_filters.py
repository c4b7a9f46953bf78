"""Silence megatron-core's known, expected start-up warnings (named one by one).

On a CPU machine megatron-core announces at import time that Apex and Transformer Engine are
missing, and warns about settings we do not use (CUDA graph scope, CUDA_DEVICE_MAX_CONNECTIONS).
They are expected here and bury the training log; any other warning still shows.
"""

import warnings

KNOWN_NOISE = (
    r".*Apex is not installed.*",
    r".*Transformer Engine and Apex are not installed.*",
    r".*full scope is deprecated.*",
    r".*CUDA_DEVICE_MAX_CONNECTIONS.*",
    r".*custom_layers.transformer_engine.*",
    # --recompute-granularity selective (core_attn): addressed to Transformer Engine's fused
    # attention; our core attentions keep what the recomputation saves (docs/RECOMPUTE.md).
    r".*no need to set 'core_attn' to recompute.*",
    # torch 2.13 deprecates the collective megatron-core 0.16.1 gathers with (MoE token
    # dispatch, the distributed optimizer); this fork does not call it.
    r".*`torch.distributed.all_gather_into_tensor` is deprecated.*",
)


def silence_known_warnings() -> None:
    for pattern in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=pattern)
