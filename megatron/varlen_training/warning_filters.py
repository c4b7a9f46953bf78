"""Silence megatron-core's known, expected start-up warnings (named one by one).

On a CPU machine megatron-core announces at import time that Apex and Transformer Engine are
missing, and warns about settings we do not use (CUDA graph scope, CUDA_DEVICE_MAX_CONNECTIONS).
They are expected here and bury the training log; any other warning still shows.

torch's CUDA build also logs one line (not a warning) when ``torch.utils.cpp_extension`` is
imported where CUDA is installed but no GPU is visible (``CUDA_VISIBLE_DEVICES=""``, a CPU run on
a GPU machine): it would stand before a bad input's one-line error (H100 run 6). That line is
dropped by a filter on its logger; the logger's other lines still show.
"""

import warnings

from megatron.varlen_training.log import drop_foreign_log_lines

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


# torch/utils/cpp_extension.py's _find_cuda_home(), at import time on torch's CUDA build.
NO_CUDA_RUNTIME_LOGGER = "torch.utils.cpp_extension"
NO_CUDA_RUNTIME_LINE = "No CUDA runtime is found"


def silence_known_warnings() -> None:
    for pattern in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    drop_foreign_log_lines(NO_CUDA_RUNTIME_LOGGER, NO_CUDA_RUNTIME_LINE)
