"""``megatron.wrap``: the HuggingFace-easy facade over this fork's training path.

    from megatron.wrap import MegatronWrap, register_flow, GPTFlow

See docs/WRAP.md (facade, flows) and docs/WRAP_CONFIG.md (config tree, logging). Names are
imported on first use (:mod:`megatron.varlen.lazy_exports`): building a config
(``megatron.wrap.config``) never imports torch.
"""

from megatron.varlen.lazy_exports import lazy_exports
from megatron.varlen_training.warning_filters import silence_known_warnings

# As pretrain_gpt.py: megatron-core's expected start-up warnings (no Apex/TE on CPU, ...) would
# bury the log; set before the facade's first use imports megatron.core.
silence_known_warnings()

_EXPORTS = {
    "MegatronWrap": "megatron.wrap.facade",
    "Flow": "megatron.wrap.flows",
    "FlowContext": "megatron.wrap.flows",
    "GPTFlow": "megatron.wrap.flows",
    "GPTSFTFlow": "megatron.wrap.flows",
    "MockFlow": "megatron.wrap.flows",
    "PER_SAMPLE": "megatron.wrap.flows",
    "register_flow": "megatron.wrap.flows",
    "registered_flows": "megatron.wrap.flows",
    "get_flow_class": "megatron.wrap.flows",
    "build_config": "megatron.wrap.config",
    "config_path": "megatron.wrap.config",
    "ConfigError": "megatron.wrap.config",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__():
    return sorted(list(globals()) + __all__)
