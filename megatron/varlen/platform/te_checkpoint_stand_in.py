"""What megatron-core 0.16.1's output-discarding checkpoint asks of Transformer Engine, where
TE is not installed.

``tensor_parallel.CheckpointWithoutOutput`` (``--recompute-modules layernorm``; ``moe_act``
upstream) sets ``self.fp8 = fp8 is not None``, so the default ``fp8=False`` takes its FP8 path:
it asks TE's ``FP8GlobalStateManager`` whether FP8 is on and enters TE's
``activation_recompute_forward`` / ``fp8_autocast``. megatron-core imports those names only
when TE is installed: without TE every such checkpoint is a NameError. Megatron-LM main keeps
that behaviour on purpose (FP8 bookkeeping with TE). :func:`install` gives the module the
answers a TE-less process has -- FP8 is never on, the contexts do nothing -- and only when TE
is absent; with TE nothing changes. (MLA's ``mla_up_proj`` checkpoint passes ``fp8=None`` and
never takes that path.)
"""

from __future__ import annotations

import contextlib

from megatron.core.tensor_parallel import random as mcore_random


class NoFP8State:
    """TE's ``FP8GlobalStateManager`` as megatron-core queries it: FP8 is off without TE."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe():
        return None


def no_te_context(*args, **kwargs) -> contextlib.AbstractContextManager:
    """TE's ``activation_recompute_forward`` / ``fp8_autocast`` without TE: nothing to enter."""
    return contextlib.nullcontext()


STAND_INS = {"FP8GlobalStateManager": NoFP8State,
             "activation_recompute_forward": no_te_context, "fp8_autocast": no_te_context}


def install() -> None:
    """Defines the stand-ins in megatron-core's ``tensor_parallel.random`` when TE is absent
    (idempotent; never replaces a name TE defined)."""
    if mcore_random.HAVE_TE:
        return
    for name, stand_in in STAND_INS.items():
        if not hasattr(mcore_random, name):
            setattr(mcore_random, name, stand_in)
