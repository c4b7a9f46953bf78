"""Fixed THD shapes: Megatron-LM's ``--pad-packed-seq-alignment``, ``--thd-max-packed-sequences``
and ``--thd-tail-padding-policy`` for our packs (what CUDA graphs and ``torch.compile`` need).

After a rank's pack is laid out (each sequence padded for its CP group), its share of the pack
(``T_r`` tokens) is padded at the end:

* alignment ``max``: to exactly ``--max-seqlen-per-dp-cp-rank`` tokens, in every micro-batch;
* alignment ``N``: up to the next multiple of ``N``;

and the padding *tail* (``c * (target - T_r)`` tokens of the whole pack of a CP group of ``c``
ranks) is laid out as the policy says:

* ``append_dummy_seq`` (the default): one more sequence of pad tokens, listed in ``cu_seqlens``
  (real and padded), split for CP like any sequence;
* ``extend_last``: the pack's last sequence gets the tail as extra padding (``cu_seqlens_padded``
  grows at its end, the real ``cu_seqlens`` stay).

``--thd-max-packed-sequences K`` caps the sequences of one rank's pack at ``K``, the dummy
sequence included (the scheduler keeps a slot free for it when the tail is a dummy), and gives
``cu_seqlens`` / ``cu_seqlens_padded`` exactly ``K + 1`` entries: the unused ones repeat the last
boundary (zero-length sequences), as in Megatron-LM.

Nothing here changes a number: padding tokens have loss_mask 0, are never attended by a real
token, and the micro-batch's ``padding_mask`` (True on every slot that holds no real token)
marks them for the layers that route tokens (MoE).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN_TO_BUDGET = "max"
APPEND_DUMMY_SEQ = "append_dummy_seq"
EXTEND_LAST = "extend_last"
TAIL_PADDING_POLICIES = (APPEND_DUMMY_SEQ, EXTEND_LAST)


@dataclass(frozen=True)
class ThdShape:
    """How every rank's pack is shaped.

    Attributes:
        alignment: Round each rank's token count up to a multiple of this (None: no rounding).
        tokens_per_rank: Pad each rank's share to exactly this many tokens (alignment ``max``,
            or virtual pipeline stages); wins over ``alignment``.
        max_packed_sequences: At most this many sequences (dummy included) per rank's pack;
            ``cu_seqlens`` then have exactly this many + 1 entries. None: no cap, no fixed size.
        tail_policy: :data:`APPEND_DUMMY_SEQ` or :data:`EXTEND_LAST`.
    """

    alignment: int | None = None
    tokens_per_rank: int | None = None
    max_packed_sequences: int | None = None
    tail_policy: str = APPEND_DUMMY_SEQ

    def __post_init__(self):
        if self.tail_policy not in TAIL_PADDING_POLICIES:
            raise ValueError(f"THD tail padding policy {self.tail_policy!r} is not one of "
                             f"{', '.join(TAIL_PADDING_POLICIES)}")
        for name in ("alignment", "tokens_per_rank", "max_packed_sequences"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value
                                      or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_real_sequences() == 0:
            raise ValueError("a cap of 1 packed sequence leaves no slot for a real sequence "
                             "beside the dummy padding sequence")

    @property
    def pads_tail(self) -> bool:
        """Whether packs get tail padding at all."""
        return self.alignment is not None or self.tokens_per_rank is not None

    def rank_tokens(self, tokens: int) -> int:
        """Tokens one rank holds once its share of ``tokens`` is tail-padded."""
        if self.tokens_per_rank is not None:
            assert tokens <= self.tokens_per_rank, (
                f"a rank's pack of {tokens} tokens exceeds the fixed {self.tokens_per_rank}")
            return self.tokens_per_rank
        if self.alignment is not None:
            return -(-tokens // self.alignment) * self.alignment
        return tokens

    def max_real_sequences(self) -> int | None:
        """The most sequences a rank may run in one micro-batch (the schedule's cap): the cap,
        less the slot a dummy tail sequence may need. None: no cap."""
        if self.max_packed_sequences is None:
            return None
        reserved = 1 if self.pads_tail and self.tail_policy == APPEND_DUMMY_SEQ else 0
        return self.max_packed_sequences - reserved

    @property
    def cu_seqlens_entries(self) -> int | None:
        """The fixed number of ``cu_seqlens`` entries (None: one per sequence, plus one)."""
        return None if self.max_packed_sequences is None else self.max_packed_sequences + 1


def pad_cu_seqlens(cu_seqlens: torch.Tensor, entries: int | None) -> torch.Tensor:
    """``cu_seqlens`` [n+1] with exactly ``entries`` entries: the added ones repeat the last
    boundary (zero-length sequences). ``entries`` None: unchanged."""
    if entries is None or cu_seqlens.numel() == entries:
        return cu_seqlens
    assert cu_seqlens.numel() < entries, (
        f"{cu_seqlens.numel() - 1} sequences exceed --thd-max-packed-sequences {entries - 1}")
    tail = cu_seqlens[-1:].expand(entries - cu_seqlens.numel())
    return torch.cat([cu_seqlens, tail])
