"""What this process can run on, and which attention backend it uses.

Small, explicit answers reused by every kernel choice (attention here; a Mamba mixer adapter
can ask the same questions): is CUDA ours (not forced off by :func:`cpu_device.force_cpu`)?
does Transformer Engine import? does torch have FlashAttention's ``varlen_attn``?

``--attention-backend {auto,flash,te,local}`` (Megatron-LM's flag name):

* ``local``: the plain-torch reference (:class:`VarlenCoreAttention`), any device and dtype;
* ``flash``: :class:`FlashVarlenCoreAttention`, torch's FlashAttention on CUDA (fp16/bf16, no
  attention dropout); on CPU the kernel's plain-torch twin (for tests: slow);
* ``te``: Transformer Engine's attention (needs TE and CUDA);
* ``auto``: TE when it imports (and CUDA is ours), else flash on CUDA when the run is fp16/bf16
  without attention dropout, else local.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from megatron.varlen.platform import cpu_device

AUTO, FLASH, TE, LOCAL = "auto", "flash", "te", "local"
VANILLA = "vanilla"  # megatron-core's softmax_type without an attention sink
# Megatron-LM's names for Transformer Engine's own kernels (its recipes pass them): run as te,
# with TE held to that kernel (megatron-core sets NVTE_*_ATTN from the config's choice).
FUSED, UNFUSED = "fused", "unfused"
TE_KERNELS = (FUSED, UNFUSED)
ATTENTION_BACKENDS = (AUTO, FLASH, TE, LOCAL, *TE_KERNELS)
_TE_PACKAGE = "transformer_engine"
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def cuda_available() -> bool:
    """CUDA is visible and this process did not choose CPU."""
    return not cpu_device.use_cpu()


@functools.lru_cache(maxsize=1)
def _te_imports() -> bool:
    if importlib.util.find_spec(_TE_PACKAGE) is None:
        return False
    try:
        from megatron.core.extensions.transformer_engine import TEDotProductAttention  # noqa
    except ImportError:
        return False
    return True


def te_available() -> bool:
    """Transformer Engine's attention can run here (TE imports and CUDA is ours)."""
    return cuda_available() and _te_imports()


def torch_varlen_attn():
    """torch's ``varlen_attn`` if this torch has it (it runs on CUDA only), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def flash_varlen_available() -> bool:
    """torch's FlashAttention varlen kernel can run here (torch has it and CUDA is ours)."""
    return cuda_available() and torch_varlen_attn() is not None


def resolve_attention_backend(requested: str, params_dtype: torch.dtype,
                              attention_dropout: float, softmax_type: str = VANILLA) -> str:
    """The backend a run uses ("flash", "te" or "local") for the requested one (Megatron-LM's
    "fused" and "unfused" are TE's kernels: "te").

    Raises:
        ValueError: one line naming the value and the flag, when the requested backend cannot
            run this configuration.
    """
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend {requested!r}: choose from {ATTENTION_BACKENDS}")
    half = params_dtype in _HALF_DTYPES
    if requested == AUTO:
        if te_available():
            return TE
        if why_not_flash(params_dtype, attention_dropout, softmax_type) is None:
            return FLASH
        return LOCAL
    if requested in (TE, *TE_KERNELS):
        if not te_available():
            raise ValueError(f"--attention-backend {requested} needs Transformer Engine and a "
                             f"CUDA device (use --attention-backend flash or local)")
        return TE
    if requested == FLASH:
        if softmax_type != VANILLA:
            raise ValueError(f"--attention-backend flash has no attention sink (--softmax-type "
                             f"{softmax_type}: torch's varlen_attn has none); use "
                             f"--attention-backend local")
        if attention_dropout > 0:
            raise ValueError(f"--attention-backend flash has no attention dropout (got "
                             f"--attention-dropout {attention_dropout}); set it to 0 or use "
                             f"--attention-backend local")
        if cuda_available() and not half:
            raise ValueError(f"--attention-backend flash on CUDA needs --bf16 or --fp16 "
                             f"(FlashAttention takes half precision; params are {params_dtype});"
                             f" use --attention-backend local for fp32")
        if cuda_available() and not flash_varlen_available():
            raise ValueError(f"--attention-backend flash needs torch.nn.attention.varlen."
                             f"varlen_attn (torch >= 2.10; this is {torch.__version__})")
    return requested


def why_not_flash(params_dtype: torch.dtype, attention_dropout: float,
                  softmax_type: str = VANILLA) -> str | None:
    """Why ``auto`` passes over the flash backend on this run (None when it does not)."""
    if not flash_varlen_available():
        return "no CUDA varlen_attn here"
    if softmax_type != VANILLA:
        return f"--softmax-type {softmax_type} (flash has no attention sink)"
    if params_dtype not in _HALF_DTYPES:
        return f"params are {params_dtype} (flash needs --bf16 or --fp16)"
    if attention_dropout > 0:
        return f"--attention-dropout {attention_dropout} > 0 (flash has no dropout)"
    return None


def describe_attention_backend(requested: str, params_dtype: torch.dtype,
                               attention_dropout: float, softmax_type: str = VANILLA) -> str:
    """The start-up line's text: the backend used, what was asked, and why auto chose it."""
    chosen = resolve_attention_backend(requested, params_dtype, attention_dropout, softmax_type)
    text = f"{chosen} (--attention-backend {requested})"
    if requested == AUTO and chosen == LOCAL:
        text += f"; not flash: {why_not_flash(params_dtype, attention_dropout, softmax_type)}"
    return text


def use_bias_dropout_add_fusion(hidden_dropout: float, add_bias: bool) -> bool:
    """Whether a run fuses bias-dropout-add: only when there is something to fuse (a bias or
    hidden dropout; otherwise the op is a single add) and the probe below passes.

    Skipping the probe where fusing gains nothing saves its torch.compile (20-60 s cold, in
    every process) in bias-free, dropout-free runs such as the GPU benchmark's.
    """
    if hidden_dropout == 0 and not add_bias:
        return False
    return bias_dropout_add_fusion_keeps_numbers()


@functools.lru_cache(maxsize=1)
def bias_dropout_add_fusion_keeps_numbers() -> bool:
    """megatron-core's fused bias-dropout-add (compiled by torch) runs on this GPU and gives
    bit-identical results to the unfused one (dropout 0); False on CPU or if it fails.

    Probed once per process on a small tensor, so a GPU machine without a working compiler
    tool chain falls back to the unfused code instead of failing in the first step.
    """
    if not cuda_available():
        return False
    try:
        from megatron.core.fusions.fused_bias_dropout import (
            bias_dropout_add_fused_train, bias_dropout_add_unfused,
        )

        gen = torch.Generator(device="cuda").manual_seed(0)
        x, residual = (torch.randn(8, 2, 64, device="cuda", generator=gen) for _ in range(2))
        bias = torch.randn(64, device="cuda", generator=gen)
        plain = bias_dropout_add_unfused(True)
        # With and without a bias (--disable-bias-linear): two different compiled graphs.
        return all(bool(torch.equal(bias_dropout_add_fused_train((x, b), residual, 0.0),
                                    plain((x, b), residual, 0.0))) for b in (bias, None))
    except Exception:  # noqa: BLE001 -- any failure means: do not fuse
        return False
