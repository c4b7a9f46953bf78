"""Megatron-LM choices that this fork does not build, each with its reason.

A flag whose Megatron-LM choice list is wider than what runs here still accepts the whole list
(:func:`megatron_lm_choices` gives the ``choices`` to register), so a Megatron-LM command line
with one of the other values gets one line naming the flag, the value, why it is not built and
what to use instead (:func:`validate_refused_choices`, exit code 2), not argparse's bare
"invalid choice". Facts from Megatron-LM core_v0.16.1 (our megatron-core's release) unless a
row says "main".

tests/unit_tests/varlen_training/test_refused_choices.py checks every row, and every built
value's acceptance, from this table; docs/FLAGS.md lists the values with their flags.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

from megatron.varlen_training.refused_flags import dest_of


class RefusedChoice(NamedTuple):
    """One value of a Megatron-LM choice flag that is refused here."""

    flag: str
    value: str
    why: str  # why it is not built here
    instead: str  # what to use instead


_MAIN_ONLY = "Megatron-LM main's, which megatron-core 0.16.1 (the engine here) does not have"
_OTHER_BALANCING = ("aux_loss, seq_aux_loss or global_aux_loss (or --moe-router-enable-expert-bias "
                    "with sigmoid scores for balancing without a loss)")

REFUSED_CHOICES: tuple[RefusedChoice, ...] = (
    RefusedChoice("--moe-token-dispatcher-type", "flex",
                  "it dispatches through DeepEP or HybridEP, CUDA communication kernels this "
                  "fork does not build",
                  "alltoall (or allgather without --sequence-packing)"),
    RefusedChoice("--moe-router-load-balancing-type", "sinkhorn",
                  "Sinkhorn routing balances each token's expert choice against every token the "
                  "rank holds (packing's padding included), so packing and the CP / sequence-"
                  "parallel split would change which experts a token gets",
                  _OTHER_BALANCING),
    RefusedChoice("--moe-router-load-balancing-type", "quantile_balancing",
                  f"quantile balancing is {_MAIN_ONLY}", _OTHER_BALANCING),
    RefusedChoice("--moe-router-score-function", "sqrtsoftplus",
                  f"the sqrtsoftplus router score is {_MAIN_ONLY}", "softmax or sigmoid"),
    RefusedChoice("--cuda-graph-impl", "full_iteration",
                  "a CUDA graph of the whole iteration (Megatron-LM main's) replays fixed "
                  "shapes, and packed THD micro-batches change length every step",
                  "none (the default)"),
    RefusedChoice("--position-embedding-type", "mrope",
                  "multimodal RoPE (--mrope-section: a temporal, height and width position per "
                  "token) is for vision-language inputs, a workload this fork does not run",
                  "rope"),
    RefusedChoice("--position-embedding-type", "relative",
                  "relative position buckets (an attention bias) are built by megatron-core's "
                  "T5 model only, a workload this fork does not run",
                  "rope"),
    RefusedChoice("--position-embedding-type", "yarn",
                  "YaRN on standard attention (Megatron-LM main's) is not built: the packed RoPE "
                  "tables here are plain RoPE",
                  "rope, or --multi-latent-attention, whose RoPE is YaRN by default "
                  "(--rope-type)"),
)


def refused_values(flag: str) -> tuple[str, ...]:
    """The values of ``flag`` refused here, in the table's order."""
    return tuple(row.value for row in REFUSED_CHOICES if row.flag == flag)


def megatron_lm_choices(flag: str, built: tuple[str, ...]) -> tuple[str, ...]:
    """``flag``'s choices to register: the ``built`` ones, then Megatron-LM's others (refused
    at validation in one line each)."""
    return (*built, *refused_values(flag))


def refused_help(flag: str) -> str:
    """A sentence for ``flag``'s help naming its refused values."""
    return f" Refused here (one line says why): {', '.join(refused_values(flag))}."


def refusal_message(row: RefusedChoice) -> str:
    """The one line that refuses ``row``'s value."""
    return f"{row.flag} {row.value} is not supported: {row.why}; use {row.instead}"


def validate_refused_choices(args: argparse.Namespace, require) -> None:
    """Refuses, in one line, a flag given one of its refused values (``require(cond,
    message)``, as validate_args does). Runs first: the other checks read these flags as
    built values."""
    for row in REFUSED_CHOICES:
        require(getattr(args, dest_of(row.flag, {})) != row.value, refusal_message(row))
