"""The variable-length attention kernel: torch's FlashAttention on CUDA, a plain-torch twin on CPU.

``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA only, fp16/bf16) computes, for
every segment i, attention of ``query[cu_q[i]:cu_q[i+1]]`` over ``key/value[cu_k[i]:cu_k[i+1]]``
and returns ``[T_q, H, D]``. Its causal mask (``window_size=(-1, 0)``) is aligned BOTTOM-RIGHT:
with ``Lq`` queries and ``Lk`` keys, query row ``j`` sees keys ``0 .. j + Lk - Lq``. That is
what lets the flash backend hand a chunk of queries its whole key PREFIX in one segment (see
:mod:`megatron.varlen.attention.attention_plan`).

:func:`emulated_varlen_attn` has the same signature and semantics in plain torch (any device,
any dtype); CPU tests run the flash backend through it, so the backend's CP logic is verified
without a GPU. :func:`call_varlen_kernel` hides one API difference: torch 2.11's ``varlen_attn``
has no ``enable_gqa`` and accepts fewer KV heads as is, from 2.12 ``enable_gqa=True`` is
required for that; which one applies is read from the signature.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch

from megatron.varlen.platform.accelerator import torch_varlen_attn

# varlen_attn's window for causal attention (left unbounded, no keys to the right).
CAUSAL_WINDOW = (-1, 0)
FULL_WINDOW = (-1, -1)
_GQA_KWARG = "enable_gqa"
_LOW_PRECISION = (torch.float16, torch.bfloat16)

VarlenKernel = Callable[..., torch.Tensor]


def emulated_varlen_attn(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor, max_q: int, max_k: int, *,
    scale: Optional[float] = None, window_size: tuple[int, int] = FULL_WINDOW,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``varlen_attn``'s semantics in plain torch: [T_q, H, D] from [T_q, H, D], [T_k, G, D].

    Segment by segment (reads the boundaries on the host: a test twin, not a fast path).
    ``window_size=(left, right)`` is aligned BOTTOM-RIGHT, as FlashAttention's: with ``Lq``
    queries and ``Lk`` keys, row j sees keys ``j + Lk - Lq - left .. j + Lk - Lq + right``
    (-1: unbounded on that side), so (-1, 0) is causal and (-1, -1) full attention. A query row
    with no visible key returns zeros. Scores are computed in fp32 for half inputs, as the
    kernel accumulates in fp32.
    """
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size {window_size}: each side must be >= -1")
    heads, groups = query.size(1), key.size(1)
    if groups != heads and not enable_gqa:
        raise ValueError(f"{groups} key/value heads for {heads} query heads needs enable_gqa")
    if heads % groups:
        raise ValueError(f"{heads} query heads are not a multiple of {groups} key/value heads")
    scale = query.size(-1) ** -0.5 if scale is None else scale
    bounds_q, bounds_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    if len(bounds_q) != len(bounds_k):
        raise ValueError("cu_seq_q and cu_seq_k must have the same number of entries")
    if bounds_q[0] != 0 or bounds_q[-1] != query.size(0):
        raise ValueError(f"cu_seq_q must run from 0 to the {query.size(0)} query rows, got "
                         f"{bounds_q[0]} .. {bounds_q[-1]}")
    pieces = []
    compute = torch.float32 if query.dtype in _LOW_PRECISION else query.dtype
    for i in range(len(bounds_q) - 1):
        q = query[bounds_q[i]:bounds_q[i + 1]].to(compute)
        k = key[bounds_k[i]:bounds_k[i + 1]].to(compute).repeat_interleave(heads // groups, 1)
        v = value[bounds_k[i]:bounds_k[i + 1]].to(compute).repeat_interleave(heads // groups, 1)
        len_q, len_k = q.size(0), k.size(0)
        if len_q > max_q or len_k > max_k:
            raise ValueError(f"segment {i}: {len_q} queries / {len_k} keys exceed max_q "
                             f"{max_q} / max_k {max_k}")
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if window_size != FULL_WINDOW:
            # offset of each key from its query's bottom-right-aligned diagonal
            offset = (torch.arange(len_k, device=q.device)[None, :]
                      - torch.arange(len_q, device=q.device)[:, None] - (len_k - len_q))
            visible = torch.ones_like(offset, dtype=torch.bool)
            if right != -1:
                visible &= offset <= right
            if left != -1:
                visible &= offset >= -left
            scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: zeros
        pieces.append(torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype))
    if not pieces:
        return query.new_zeros(0, heads, value.size(-1))
    return torch.cat(pieces)


@functools.lru_cache(maxsize=8)
def _keywords(kernel: VarlenKernel) -> frozenset:
    try:
        return frozenset(inspect.signature(kernel).parameters)
    except (TypeError, ValueError):
        return frozenset()


def takes_enable_gqa(kernel: VarlenKernel) -> bool:
    """Whether ``kernel`` has the ``enable_gqa`` keyword (torch >= 2.12's varlen_attn does)."""
    return _GQA_KWARG in _keywords(kernel)


def kernel_keywords(kernel: VarlenKernel, scale: float, head_dim: int, causal: bool,
                    bottom_right: bool, gqa: bool, window_left: Optional[int] = None) -> dict:
    """The keyword arguments this ``kernel``'s signature takes for one call.

    ``window_left``: a causal sliding window, each query sees that many earlier keys (None:
    all of them). torch 2.9/2.10's ``varlen_attn`` had ``is_causal`` and no
    ``scale``/``window_size``; the plan's non-square causal segments (CP > 1) and a sliding
    window need the bottom-right ``window_size`` form, and a non-default scale needs ``scale``:
    refused in one line where the kernel lacks them.
    """
    names = _keywords(kernel)
    kwargs = {}
    if window_left is not None and not causal:
        raise ValueError("a sliding window needs causal attention here (window_size right 0)")
    if "window_size" in names:
        kwargs["window_size"] = ((-1 if window_left is None else window_left, 0) if causal
                                 else FULL_WINDOW)
    elif window_left is not None:
        raise RuntimeError(f"this torch's varlen_attn ({torch.__version__}) has no window_size: "
                           f"--window-size needs torch >= 2.11 (or --attention-backend local)")
    elif "is_causal" in names and not (causal and bottom_right):
        kwargs["is_causal"] = causal
    elif causal:
        raise RuntimeError(f"this torch's varlen_attn ({torch.__version__}) has no window_size: "
                           f"causal context parallelism needs torch >= 2.11 "
                           f"(or --attention-backend local)")
    if "scale" in names:
        kwargs["scale"] = scale
    elif abs(scale - head_dim ** -0.5) > 1e-12 * scale:
        raise RuntimeError(f"this torch's varlen_attn ({torch.__version__}) takes no scale; "
                           f"softmax scale {scale} needs torch >= 2.11")
    if gqa and takes_enable_gqa(kernel):
        kwargs[_GQA_KWARG] = True
    return kwargs


def call_varlen_kernel(
    kernel: VarlenKernel, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor, max_q: int, max_k: int,
    scale: float, causal: bool, bottom_right: bool = True, window_left: Optional[int] = None,
) -> torch.Tensor:
    """One kernel call with the keywords this torch's ``varlen_attn`` wants.

    ``bottom_right``: some segment has fewer query rows than keys and relies on the bottom-right
    causal alignment (False when every segment is square, as with CP 1). ``window_left``: see
    :func:`kernel_keywords`.
    """
    kwargs = kernel_keywords(kernel, scale, query.size(-1), causal, bottom_right,
                             gqa=key.size(1) != query.size(1), window_left=window_left)
    return kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs)


def kernel_for(device: torch.device) -> VarlenKernel:
    """torch's FlashAttention kernel for CUDA tensors, the plain-torch twin elsewhere."""
    real = torch_varlen_attn()
    if device.type == "cuda" and real is not None:
        return real
    if device.type == "cuda":
        raise RuntimeError(f"the flash attention backend needs torch.nn.attention.varlen."
                           f"varlen_attn (torch >= 2.10); this is torch {torch.__version__}: "
                           f"use --attention-backend local")
    return emulated_varlen_attn
