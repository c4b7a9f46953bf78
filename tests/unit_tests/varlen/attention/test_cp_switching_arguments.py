"""CPSwitchingSelfAttention.forward's (and the MLA attention's) view of its call: the same call
as the caller's, with every argument it reads or changes among the keywords, and no signature
binding for the call megatron-core's TransformerLayer makes.

The forwards used to bind their parent's signature on every call (tens of microseconds per
layer and micro-batch, every step). Reference: Python's own binding of the caller's call
(``inspect.Signature.bind``), for every split of the arguments into positional and keyword
ones, for ``SelfAttention.forward`` and ``MLASelfAttention.forward`` (whose parameters after
``packed_seq_params`` differ).
"""

import inspect

import pytest
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from megatron.varlen.attention import cp_switching
from megatron.varlen.attention.cp_switching import call_arguments

SIGNATURES = {"self_attention": (inspect.signature(SelfAttention.forward), None),
              "mla": (inspect.signature(MLASelfAttention.forward),
                      inspect.signature(MLASelfAttention.forward))}
SIGNATURE = SIGNATURES["self_attention"][0]
READ = ("packed_seq_params", "rotary_pos_emb", "inference_context", "inference_params")
MODULE = object()


def _names(signature) -> list[str]:
    return [name for name, p in signature.parameters.items()
            if p.kind is p.POSITIONAL_OR_KEYWORD and name != "self"]


NAMES = _names(SIGNATURE)


def _call(num_positional: int, passed: list[str], names: list[str] = NAMES) -> tuple[tuple, dict]:
    """``passed`` as values named after themselves, the first ``num_positional`` of ``names``
    by position (the parameters before them too), the rest by keyword."""
    positional = names[:num_positional]
    args = tuple(f"value of {name}" for name in positional)
    kwargs = {name: f"value of {name}" for name in passed if name not in positional}
    return args, kwargs


CALLS = [(forward, n, passed) for forward, (signature, _) in SIGNATURES.items()
         for n in range(len(_names(signature)) + 1)
         for passed in (_names(signature), ["hidden_states", "attention_mask",
                                            "packed_seq_params"],
                        [*_names(signature), "inference_params"])]


@pytest.mark.parametrize("forward, num_positional, passed", CALLS)
def test_the_call_binds_as_the_callers(forward, num_positional, passed):
    signature, given = SIGNATURES[forward]
    names = _names(signature)
    args, kwargs = _call(num_positional, passed, names)
    out_args, keywords = call_arguments(MODULE, args, kwargs, given)
    assert (signature.bind(MODULE, *out_args, **keywords).arguments
            == signature.bind(MODULE, *args, **kwargs).arguments)
    for name in READ:
        assert (name in keywords) == (name in passed or name in names[:num_positional])
    keywords["packed_seq_params"] = None  # the forward's change reaches the parent's call
    assert signature.bind(MODULE, *out_args, **keywords).arguments["packed_seq_params"] is None


def test_transformer_layers_call_is_not_bound(monkeypatch):
    class NoBinding:
        def bind_partial(self, *args, **kwargs):
            raise AssertionError("bound the signature")

    monkeypatch.setattr(cp_switching, "_FORWARD_SIGNATURE", NoBinding())
    args, kwargs = _call(1, NAMES)  # hidden_states by position, the rest by keyword
    assert call_arguments(MODULE, args, kwargs) == (args, kwargs)
    with pytest.raises(AssertionError, match="bound the signature"):
        call_arguments(MODULE, *_call(3, NAMES))
