"""Fields of an SFT record that ``--sft`` would not read although they change what trains.

``--sft`` builds every sample from the conversation alone: it renders the turns, tokenizes
them and trains on the assistant turns. A record (JSONL object, Parquet/Arrow row) that also
carries its own token ids or loss mask (a list under ``input_ids``, ``labels``, ``loss_mask``,
...), or a message that carries what the template would need beside ``role`` and ``content``
(OpenAI's per-message ``weight``, ``tool_calls``), would train on something else than its
author prepared, without a word. Such a field is a one-line error naming it instead.

Allowed: metadata (``id``, ``source``, a ``prompt`` beside ``messages`` as UltraChat has, a
scalar under a per-token name such as a class label under ``labels``); a field that holds
nothing (a JSONL ``null``, an Arrow column of null type or a null row; for the message fields
also an empty list or string, which exports write on every message); a ``weight`` that says
what ``--sft`` trains anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from megatron.varlen_training.tokenizer import TRAINED_ROLE

# Record keys/columns of per-token data: Hugging Face's (input_ids, attention_mask, labels,
# assistant_masks from return_assistant_tokens_mask), Megatron's (tokens, labels, loss_mask,
# position_ids) and the id forms of megatron.wrap's gpt_sft flow. Refused when they hold a list
# (a scalar under such a name, e.g. a classification label or a token count, is metadata).
PER_TOKEN_KEYS = ("input_ids", "tokens", "labels", "loss_mask", "attention_mask",
                  "assistant_masks", "position_ids", "prompt_ids", "response_ids")
# megatron-wrap's prompt length beside input_ids (its masking form): refused whatever it holds.
PROMPT_LENGTH_KEYS = ("context_token_length",)
# Message keys a chat template would render but --sft does not pass on (it passes role and
# content), so the turn would train as if they were absent.
UNRENDERED_MESSAGE_KEYS = ("tool_calls", "function_call", "reasoning_content")
WEIGHT_KEY = "weight"  # OpenAI's per-message loss weight: 0 or 1, on assistant messages
PRETOKENIZED_HINT = ("--sft tokenizes the conversation and masks all but the assistant turns "
                     "itself; remove it, or train pre-tokenised samples through megatron.wrap's "
                     "gpt_sft flow (docs/WRAP.md)")


def first_pretokenized(fields: Iterable[tuple[str, bool]]) -> str | None:
    """The first field of ``(name, holds a list)`` pairs (non-null fields only) that holds
    pre-tokenised or pre-masked data, in ``PER_TOKEN_KEYS`` order; None when none does."""
    found = {name for name, is_list in fields
             if (name in PER_TOKEN_KEYS and is_list) or name in PROMPT_LENGTH_KEYS}
    return next((key for key in PER_TOKEN_KEYS + PROMPT_LENGTH_KEYS if key in found), None)


def refuse_pretokenized(record: Mapping) -> None:
    """ValueError naming the first pre-tokenised key of a JSONL record (null values hold
    nothing and pass)."""
    found = first_pretokenized((key, isinstance(value, list)) for key, value in record.items()
                               if value is not None)
    if found is not None:
        raise ValueError(f"key {found!r} (pre-tokenised or pre-masked data) would be "
                         f"ignored: {PRETOKENIZED_HINT}")


def refuse_unread_message_keys(message: Mapping, index: int) -> None:
    """ValueError when message ``index`` carries a field the template would need (non-empty
    ``tool_calls``, ...) or a ``weight`` that disagrees with --sft's mask (assistant turns
    are trained, the others are not)."""
    for key in UNRENDERED_MESSAGE_KEYS:
        if message.get(key):  # null, [] and "" hold nothing (exports often write them)
            raise ValueError(f"message {index} has {key!r}, which --sft does not pass to the "
                             "template (it reads role and content): the turn would train "
                             "without it; remove the field or the turn")
    weight = message.get(WEIGHT_KEY)
    trained = message.get("role") == TRAINED_ROLE
    if weight is not None and weight != int(trained):
        raise ValueError(f"message {index} ({message.get('role')}) has weight {weight!r}, but "
                         f"--sft trains every assistant turn and no other (weight "
                         f"{int(trained)} here); remove the weight, or the turn")
