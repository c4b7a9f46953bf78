"""The facade's Hugging Face side: a config that starts from a local checkpoint directory.

``MegatronWrap.from_pretrained(hf_dir, config)`` takes the training settings from ``config`` and
the model from ``hf_dir``: ``--hf-checkpoint`` is set, so the architecture flags come from the
checkpoint's ``config.json`` (an architecture key in ``config`` must agree with it, or
initialisation fails in one line naming both values), and when the directory holds a tokenizer
and ``config`` names none, the directory's tokenizer (and its chat template) is used.
"""

from __future__ import annotations

import dataclasses
import os

from megatron.varlen_training.tokenizer import HF_TOKENIZER_TYPE
from megatron.wrap.config import WrapConfig

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def pretrained_config(config: WrapConfig, hf_dir: str) -> WrapConfig:
    """``config`` initialised from the Hugging Face checkpoint directory ``hf_dir``."""
    hf_dir = os.fspath(hf_dir)
    flat = {**config.flat, "hf_checkpoint": hf_dir}
    sources = {**config.sources, "hf_checkpoint": "from_pretrained()"}
    has_tokenizer = any(os.path.isfile(os.path.join(hf_dir, f)) for f in HF_TOKENIZER_FILES)
    if has_tokenizer and flat.get("tokenizer_type") in (None, HF_TOKENIZER_TYPE) \
            and not flat.get("tokenizer_model"):
        flat.update(tokenizer_type=HF_TOKENIZER_TYPE, tokenizer_model=hf_dir)
        sources.update(tokenizer_type="from_pretrained()", tokenizer_model="from_pretrained()")
    return dataclasses.replace(config, flat=flat, sources=sources)

