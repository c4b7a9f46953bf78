"""Render a conversation with a Hugging Face tokenizer's own chat template, and find the tokens
that belong to assistant turns.

The loss mask comes from the rendered text itself, not from hand-made role markers: the
conversation is rendered prefix by prefix (``messages[:i]`` with the generation prompt, then
``messages[:i + 1]``), so the text an assistant turn adds after the template's assistant header
is known exactly, including the template's own end-of-turn marker. The whole text is then
tokenized once and each token is a target when its characters start inside such a span.

A template whose rendering of a prefix is not a prefix of the longer rendering (e.g. one that
rewrites earlier turns, such as stripping reasoning from them) cannot be masked this way and is
refused in one line naming the turn; so is a conversation the template itself rejects (its
``raise_exception``, e.g. roles that do not alternate), which would otherwise escape as a
traceback.
"""

from __future__ import annotations

import numpy as np

TRAINED_ROLE = "assistant"
Span = tuple[int, int]  # [start, stop) characters of the rendered text


class ChatTemplateError(ValueError):
    """A conversation the tokenizer's template cannot render with a reliable mask."""


def _render(hf_tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    if not messages and not generation_prompt:
        return ""
    import jinja2  # transformers renders templates with it (the [hf] extra)

    try:
        return hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=generation_prompt)
    except jinja2.TemplateError as err:  # e.g. raise_exception('roles must alternate ...')
        raise ChatTemplateError(f"the tokenizer's chat template refuses this conversation "
                                f"({' '.join(str(err).split())}); fix the conversation or "
                                "the template (--tokenizer-model)") from err


def _extend(text: str, longer: str, what: str) -> str:
    if not longer.startswith(text):
        raise ChatTemplateError(
            f"the tokenizer's chat template is not prefix-stable at {what} (it re-renders "
            "earlier turns), so the assistant tokens cannot be located")
    return longer


def assistant_spans(hf_tokenizer, turns: list[tuple[str, str]]) -> tuple[str, list[Span]]:
    """The rendered conversation and the [start, stop) character spans of assistant turns
    (what each adds after the template's assistant header, end-of-turn marker included)."""
    messages = [{"role": role, "content": content} for role, content in turns]
    spans = []
    text = ""
    for i, (role, _) in enumerate(turns):
        if role == TRAINED_ROLE:
            text = _extend(text, _render(hf_tokenizer, messages[:i], True), f"turn {i}")
            start = len(text)
        text = _extend(text, _render(hf_tokenizer, messages[: i + 1], False), f"turn {i}")
        if role == TRAINED_ROLE:
            spans.append((start, len(text)))
    return text, spans


def encode_chat(hf_tokenizer, turns: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, is_target)`` of the conversation rendered by the tokenizer's chat template;
    ``is_target`` marks the tokens of assistant turns."""
    text, spans = assistant_spans(hf_tokenizer, turns)
    if not getattr(hf_tokenizer, "is_fast", False):
        raise ChatTemplateError("chat-template SFT needs a fast (tokenizers-backed) tokenizer "
                                "for character offsets (--tokenizer-model)")
    encoded = hf_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    starts = np.asarray([start for start, _ in encoded["offset_mapping"]], dtype=np.int64)
    is_target = np.zeros(len(ids), dtype=bool)
    for start, stop in spans:
        is_target |= (starts >= start) & (starts < stop)
    return ids, is_target
