"""Resolve the layer spec a run uses (Megatron's ``--spec MODULE FUNCTION``) and what it can do.

Sequence packing feeds attention THD (packed) input. Only core attentions known to take it are
accepted: this fork's :class:`VarlenCoreAttention` and Transformer Engine's attention (GPU).
megatron-core's own ``DotProductAttention`` rejects THD, so a spec built on it is refused at
start-up with one line instead of failing inside the first forward.
"""

from __future__ import annotations

from importlib import import_module

DEFAULT_SPEC = ("megatron.varlen.model.spec", "get_varlen_gpt_layer_spec")
# Core attentions (by qualified class name) that take packed THD input with cu_seqlens.
THD_CAPABLE_CORE_ATTENTION = frozenset({
    "megatron.varlen.attention.core_attention.VarlenCoreAttention",
    "megatron.varlen.attention.flash_attention.FlashVarlenCoreAttention",
    "megatron.core.extensions.transformer_engine.TEDotProductAttention",
})


def is_default_spec(spec: tuple[str, str] | list[str] | None) -> bool:
    """No ``--spec``, or ``--spec`` naming our own default spec function."""
    return spec is None or tuple(spec) == DEFAULT_SPEC


def load_layer_spec(spec: tuple[str, str] | list[str] | None, normalization: str,
                    attention_backend: str | None = None, qk_layernorm: bool = False,
                    multi_latent_attention: bool = False):
    """The decoder layer ModuleSpec: ours by default (with ``attention_backend``, a resolved
    --attention-backend, ``qk_layernorm`` and ``multi_latent_attention``), else the user's spec
    function, called without arguments as Megatron-LM calls it (the spec then decides
    normalization, QK norms and the attention class)."""
    module_name, function_name = spec or DEFAULT_SPEC
    try:
        function = getattr(import_module(module_name), function_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--spec {module_name} {function_name}: cannot import it ({err})") from err
    if not is_default_spec(spec):
        return function()
    return function(normalization=normalization, attention_backend=attention_backend,
                    qk_layernorm=qk_layernorm, multi_latent_attention=multi_latent_attention)


def core_attention_name(layer_spec) -> str:
    """Qualified class name of the spec's core attention."""
    attention = layer_spec.submodules.self_attention.submodules.core_attention
    module = getattr(attention, "module", attention)  # a ModuleSpec or a class
    if isinstance(module, tuple):  # lazy (path, name) form
        return ".".join(module)
    return f"{module.__module__}.{module.__qualname__}"


def check_has_qk_layernorm(layer_spec, spec_flag) -> None:
    """Raises ValueError (one line) when --qk-layernorm is asked of a spec without QK norms:
    megatron-core builds whatever the spec names, so the flag would do nothing."""
    attention = layer_spec.submodules.self_attention.submodules
    norm = getattr(attention, "q_layernorm", None)
    name = getattr(norm, "__name__", type(norm).__name__)
    if norm is None or name == "IdentityOp":
        raise ValueError(
            f"--qk-layernorm: the layer spec from --spec {' '.join(spec_flag)} has no query/key "
            f"layer norm (q_layernorm is {name}), so the flag would do nothing (build the spec "
            f"with QK norms, or drop --spec)")


def check_takes_thd(layer_spec, spec_flag) -> None:
    """Raises ValueError (one line) when the spec's core attention cannot take THD input."""
    name = core_attention_name(layer_spec)
    if name not in THD_CAPABLE_CORE_ATTENTION:
        shown = " ".join(spec_flag or DEFAULT_SPEC)
        raise ValueError(
            f"--sequence-packing needs a core attention that takes packed THD input; the layer "
            f"spec from --spec {shown} uses {name} (use the default spec or one built on "
            f"VarlenCoreAttention / TEDotProductAttention)")
