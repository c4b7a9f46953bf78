"""Chat-template SFT: the loss mask covers exactly the assistant tokens of the rendered template.

Two template styles (ChatML/Qwen-like and Llama-3-like) on tokenizers built here. The expected
assistant tokens come from an independent rendering: each assistant turn's text written out by
hand for the style (content plus its end-of-turn marker), tokenized on its own.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from megatron.varlen_training.datasets.sft import SFTDataset, encode_turns, parse_turns
from megatron.varlen_training.hf.chat_template import ChatTemplateError, encode_chat
from megatron.varlen_training.tokenizer import build_tokenizer
from tests.harness.extras import needs_extra
from tests.unit_tests.varlen_training.hf.tiny_models import save_tokenizer

pytestmark = needs_extra("hf")

REPO = Path(__file__).resolve().parents[4]
SHIPPED = REPO / "examples" / "data" / "sft_tiny.jsonl"
# The assistant turn as each style writes it, by hand.
ASSISTANT_TEXT = {
    "chatml": lambda content: content + "<|im_end|>\n",
    "llama3": lambda content: content.strip() + "<|eot_id|>",
}
CONVERSATIONS = [
    [("user", "Hello, how are you?"), ("assistant", "Fine, thanks!")],
    [("system", "Be brief."), ("user", "The fox?"), ("assistant", " It jumps over the dog. "),
     ("user", "And then?"), ("assistant", "Packing.")],
    [("user", "no answer here")],
]


@pytest.fixture(scope="module", params=sorted(ASSISTANT_TEXT))
def style_tokenizer(request, tmp_path_factory):
    path = save_tokenizer(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, build_tokenizer("HuggingFaceTokenizer", tokenizer_model=path)


def _target_runs(ids: np.ndarray, is_target: np.ndarray) -> list[list[int]]:
    runs, current = [], []
    for token, target in zip(ids.tolist(), is_target.tolist()):
        if target:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def _expected_runs(style, tokenizer, turns) -> list[list[int]]:
    return [tokenizer.tokenize(ASSISTANT_TEXT[style](content))
            for role, content in turns if role == "assistant"]


def _shipped_conversations():
    with open(SHIPPED, encoding="utf-8") as handle:
        return [parse_turns(json.loads(line)) for line in handle if line.strip()]


def test_mask_covers_exactly_the_assistant_turns(style_tokenizer):
    style, tokenizer = style_tokenizer
    for turns in CONVERSATIONS + _shipped_conversations():
        ids, is_target = encode_turns(turns, tokenizer)
        hf = tokenizer._hf
        rendered = hf.apply_chat_template([{"role": r, "content": c} for r, c in turns],
                                          tokenize=False)
        assert ids.tolist() == tokenizer.tokenize(rendered), "not the template's rendering"
        assert _target_runs(ids, is_target) == _expected_runs(style, tokenizer, turns), turns


def test_sft_dataset_trains_on_assistant_labels_and_counts_truncation(style_tokenizer, tmp_path,
                                                                      capsys):
    style, tokenizer = style_tokenizer
    path = tmp_path / "chats.jsonl"
    records = [{"messages": [{"role": r, "content": c} for r, c in turns]}
               for turns in CONVERSATIONS[:2]]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    dataset = SFTDataset(str(path), tokenizer, seq_length=512)
    for index, turns in enumerate(CONVERSATIONS[:2]):
        sample = dataset[index]
        trained = sample["labels"][sample["loss_mask"] > 0].tolist()
        assert trained == sum(_expected_runs(style, tokenizer, turns), [])
    short = SFTDataset(str(path), tokenizer, seq_length=8)
    assert short.num_truncated == 2 and int(short.lengths.max()) == 8
    out = capsys.readouterr().out  # the warning is a megatron log line on stdout
    assert "WARNING SFTDataset: 2 of 2 samples" in out and "truncated" in out


def test_template_that_rewrites_earlier_turns_is_refused(style_tokenizer):
    _, tokenizer = style_tokenizer
    hf = tokenizer._hf
    original = hf.chat_template
    # Drops the content of every assistant turn but the last one (as reasoning-strip templates do).
    hf.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' }}{% if m['role'] != "
                        "'assistant' or loop.last %}{{ m['content'] }}{% endif %}{{ '\\n' }}"
                        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    try:
        with pytest.raises(ChatTemplateError) as err:
            encode_chat(hf, CONVERSATIONS[1])
        assert "\n" not in str(err.value) and "turn 3" in str(err.value)
    finally:
        hf.chat_template = original


# The two templates again, with transformers' {% generation %} markers around what an assistant
# turn trains on (the text after its header, end-of-turn marker included): the reference for
# transformers' own return_assistant_tokens_mask. The rendering is the same text.
_ASSISTANT_BODY = {
    "chatml": ("{{ '<|im_start|>' + m['role'] + '\\n' }}", "m['content'] + '<|im_end|>\\n'"),
    "llama3": ("{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}",
               "(m['content'] | trim) + '<|eot_id|>'"),
}
_GENERATION_TEMPLATE = (
    "{prologue}{{% for m in messages %}}{header}{{% if m['role'] == 'assistant' %}}"
    "{{% generation %}}{{{{ {body} }}}}{{% endgeneration %}}{{% else %}}{{{{ {body} }}}}"
    "{{% endif %}}{{% endfor %}}{{% if add_generation_prompt %}}{prompt}{{% endif %}}")
_PROLOGUE_AND_PROMPT = {
    "chatml": ("", "{{ '<|im_start|>assistant\\n' }}"),
    "llama3": ("{{ bos_token }}",
               "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"),
}
EDGE_CONVERSATIONS = [
    [("user", "q"), ("assistant", "\n\nHello there")],  # leading newlines after the header
    [("user", "q"), ("assistant", "   spaced")],
    [("user", "q"), ("assistant", "")],  # only the end-of-turn marker is trained
    [("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"),
     ("user", "e"), ("assistant", "f")],
]


def _generation_template(style: str) -> str:
    header, body = _ASSISTANT_BODY[style]
    prologue, prompt = _PROLOGUE_AND_PROMPT[style]
    return _GENERATION_TEMPLATE.format(prologue=prologue, header=header, body=body,
                                       prompt=prompt)


def test_mask_equals_transformers_assistant_tokens_mask(style_tokenizer):
    """transformers' apply_chat_template(..., return_assistant_tokens_mask=True) on the same
    template with generation markers gives the same ids and the same mask: multi-turn, a system
    prompt, an assistant-less conversation, leading whitespace, an empty answer."""
    style, tokenizer = style_tokenizer
    hf, template = tokenizer._hf, _generation_template(style)
    for turns in CONVERSATIONS + EDGE_CONVERSATIONS + _shipped_conversations():
        messages = [{"role": role, "content": content} for role, content in turns]
        assert hf.apply_chat_template(messages, tokenize=False, chat_template=template) == \
            hf.apply_chat_template(messages, tokenize=False), "not the same rendering"
        reference = hf.apply_chat_template(messages, chat_template=template, tokenize=True,
                                           return_dict=True, return_assistant_tokens_mask=True)
        ids, is_target = encode_turns(turns, tokenizer)
        assert ids.tolist() == reference["input_ids"], turns
        assert is_target.astype(int).tolist() == reference["assistant_masks"], turns


def _open_sft(path, tokenizer):
    from types import SimpleNamespace

    from megatron.varlen_training.datasets.builder import open_sft_data

    run = SimpleNamespace(model=SimpleNamespace(seq_length=512), data=SimpleNamespace(
        sft_messages_key="messages", sft_prompt_key="prompt", sft_response_key="response"))
    return open_sft_data(str(path), tokenizer, run, 1, False)


def test_a_tokenizer_without_chat_template_is_said_in_the_log(style_tokenizer, capsys):
    """A base model's tokenizer (no chat_template) trains with this fork's plain markers: the
    log says so once at start-up (it used to be silent); with a template it says nothing."""
    _, tokenizer = style_tokenizer
    _open_sft(SHIPPED, tokenizer)
    assert "has no chat template" not in capsys.readouterr().out
    hf = tokenizer._hf
    original, hf.chat_template = hf.chat_template, None
    try:
        _open_sft(SHIPPED, tokenizer)
    finally:
        hf.chat_template = original
    out = capsys.readouterr().out
    assert out.count("--sft: the --tokenizer-model tokenizer has no chat template") == 1
    assert "'<|user|>\\n'" in out


def test_conversation_the_template_rejects_is_one_line_naming_the_line(style_tokenizer,
                                                                         tmp_path):
    """A template's raise_exception (Llama-2/Mistral-style 'roles must alternate') was a jinja2
    TemplateError, not a ValueError: a traceback at start-up (JSONL) or mid-run (Parquet)."""
    _, tokenizer = style_tokenizer
    hf = tokenizer._hf
    original = hf.chat_template
    hf.chat_template = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/...') }}"
        "{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    path = tmp_path / "chats.jsonl"
    conversations = [[("user", "a"), ("assistant", "b")],
                     [("user", "a"), ("user", "b"), ("assistant", "c")]]
    path.write_text("".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})
                            + "\n" for turns in conversations))
    try:
        with pytest.raises(ValueError) as err:
            SFTDataset(str(path), tokenizer, 64)
    finally:
        hf.chat_template = original
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}:2: the tokenizer's chat template "
                                                      "refuses this conversation (Conversation "
                                                      "roles must alternate"), message
