"""CPSwitchingSelfAttention.forward's view of its call: the same call as the caller's, with
every argument it reads or changes among the keywords, and no signature binding for the call
megatron-core's TransformerLayer makes.

The forward used to bind ``SelfAttention.forward``'s signature on every call (tens of
microseconds per layer and micro-batch, every step). Reference: Python's own binding of the
caller's call (``inspect.Signature.bind``), for every split of the arguments into positional
and keyword ones.
"""

import inspect

import pytest
from megatron.core.transformer.attention import SelfAttention

from megatron.varlen.attention import cp_switching
from megatron.varlen.attention.cp_switching import call_arguments

SIGNATURE = inspect.signature(SelfAttention.forward)
NAMES = [name for name, p in SIGNATURE.parameters.items()
         if p.kind is p.POSITIONAL_OR_KEYWORD and name != "self"]
READ = ("packed_seq_params", "rotary_pos_emb", "inference_context", "inference_params")
MODULE = object()


def _call(num_positional: int, passed: list[str]) -> tuple[tuple, dict]:
    """``passed`` as values named after themselves, the first ``num_positional`` by position
    (the parameters before them too), the rest by keyword."""
    names = NAMES[:num_positional]
    args = tuple(f"value of {name}" for name in names)
    kwargs = {name: f"value of {name}" for name in passed if name not in names}
    return args, kwargs


CALLS = [(n, passed) for n in range(len(NAMES) + 1)
         for passed in (NAMES, ["hidden_states", "attention_mask", "packed_seq_params"],
                        [*NAMES, "inference_params"])]


@pytest.mark.parametrize("num_positional, passed", CALLS)
def test_the_call_binds_as_the_callers(num_positional, passed):
    args, kwargs = _call(num_positional, passed)
    out_args, keywords = call_arguments(MODULE, args, kwargs)
    assert (SIGNATURE.bind(MODULE, *out_args, **keywords).arguments
            == SIGNATURE.bind(MODULE, *args, **kwargs).arguments)
    for name in READ:
        assert (name in keywords) == (name in passed or name in NAMES[:num_positional])
    keywords["rotary_pos_emb"] = None  # the forward's change reaches the parent's call
    assert SIGNATURE.bind(MODULE, *out_args, **keywords).arguments["rotary_pos_emb"] is None


def test_transformer_layers_call_is_not_bound(monkeypatch):
    class NoBinding:
        def bind_partial(self, *args, **kwargs):
            raise AssertionError("bound the signature")

    monkeypatch.setattr(cp_switching, "_FORWARD_SIGNATURE", NoBinding())
    args, kwargs = _call(1, NAMES)  # hidden_states by position, the rest by keyword
    assert call_arguments(MODULE, args, kwargs) == (args, kwargs)
    with pytest.raises(AssertionError, match="bound the signature"):
        call_arguments(MODULE, *_call(3, NAMES))
