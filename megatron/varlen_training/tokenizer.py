"""Tokenizers for the training layer, selected by ``--tokenizer-type``.

Every tokenizer offers the same small interface (:class:`Tokenizer`): ``vocab_size``, ``eod``,
``pad``, ``tokenize(text) -> list[int]``, ``detokenize(ids) -> str`` and
``role_marker(role) -> list[int]`` (the ids that open a chat turn in the SFT template, see
``megatron/varlen_training/datasets/sft.py``). Every id a tokenizer returns, including ``eod`` and
``pad``, is ``< vocab_size``.

- ``NullTokenizer`` (``--vocab-size V``): text is whitespace-separated integer ids; ``eod = pad =
  V - 1``. No chat markers.
- ``ByteLevelTokenizer``: UTF-8 bytes 0..255 plus five special ids (eod, pad, system, user,
  assistant); needs no download. Not megatron-core's class of the same name (eod 0, pad 1):
  indexed data preprocessed with that one is refused at start-up (datasets/token_checks.py).
- ``HuggingFaceTokenizer`` (``--tokenizer-model PATH``): a local ``transformers`` tokenizer
  directory, loaded offline. With a chat template, SFT conversations are rendered by it
  (``encode_chat``, see ``megatron/varlen_training/hf/chat_template.py``); without one, turns open
  with ``<|role|>\n`` as text.
- ``GPT2BPETokenizer`` (``--vocab-file F --merge-file F``): Megatron-LM's GPT-2 BPE, built from
  the two files (``megatron/varlen_training/megatron_lm_tokenizers.py``), adapted like a
  HuggingFace tokenizer; eod is ``<|endoftext|>``.
- ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer``, ``Llama2Tokenizer``
  (``--tokenizer-model F.model``) and ``TikTokenizer`` (``--tokenizer-model F.json``, the
  ``--tiktoken-*`` flags): Megatron-LM's, megatron-core's tokenizer libraries adapted by
  :class:`LibraryTokenizer` (``megatron/varlen_training/model_file_tokenizers.py``); they need
  the sentencepiece / tiktoken package.

Megatron-LM's other types, and these without their package, are accepted by the flag parser and
refused in one line (:func:`megatron.varlen_training.megatron_lm_tokenizers.unavailable_reason`).
"""

from __future__ import annotations

import os
from typing import Sequence

from megatron.varlen_training.megatron_lm_tokenizers import (
    GPT2_BPE_TYPE, MEGATRON_LM_ONLY_TYPES, gpt2_bpe_backend, unavailable_reason,
)
from megatron.varlen_training.model_file_tokenizers import (
    MODEL_FILE_TYPES, SENTENCEPIECE_TYPES, TIKTOKEN_TYPE, NO_ID, ModelFileOptions,
    sentencepiece_library, tiktoken_library,
)

HF_TOKENIZER_TYPE = "HuggingFaceTokenizer"
TOKENIZER_TYPES = ("NullTokenizer", "ByteLevelTokenizer", HF_TOKENIZER_TYPE, GPT2_BPE_TYPE,
                   *MODEL_FILE_TYPES)
# What --tokenizer-type accepts: the types built here and Megatron-LM's others, which are
# refused in one line saying why (a missing package, a model family this fork does not train).
TOKENIZER_TYPE_CHOICES = TOKENIZER_TYPES + tuple(
    kind for kind in MEGATRON_LM_ONLY_TYPES if kind not in TOKENIZER_TYPES)
# The flags that decide which ids a type gives: what to change when data and tokenizer disagree.
TOKENIZER_TYPE_FLAGS = {
    "NullTokenizer": ("--vocab-size",),
    "ByteLevelTokenizer": (),
    HF_TOKENIZER_TYPE: ("--tokenizer-model",),
    GPT2_BPE_TYPE: ("--vocab-file", "--merge-file"),
    **dict.fromkeys(SENTENCEPIECE_TYPES, ("--tokenizer-model",)),
    TIKTOKEN_TYPE: ("--tokenizer-model", "--vocab-size", "--tiktoken-pattern",
                    "--tiktoken-num-special-tokens", "--tokenizer-special-tokens"),
}
CHAT_ROLES = ("system", "user", "assistant")
TRAINED_ROLE = "assistant"  # the turns SFT trains on (the others are masked)

# ByteLevelTokenizer layout: ids 0..255 are raw bytes, the special ids follow.
NUM_BYTES = 256
BYTE_EOD = NUM_BYTES
BYTE_PAD = NUM_BYTES + 1
BYTE_ROLE_IDS = {"system": NUM_BYTES + 2, "user": NUM_BYTES + 3, "assistant": NUM_BYTES + 4}
BYTE_VOCAB_SIZE = NUM_BYTES + 5
_BYTE_SPECIAL_NAMES = {BYTE_EOD: "eod", BYTE_PAD: "pad", **{v: k for k, v in BYTE_ROLE_IDS.items()}}

# Text that opens a chat turn for tokenizers without dedicated role ids (HuggingFace).
HF_ROLE_MARKER_FORMAT = "<|{role}|>\n"


class Tokenizer:
    """Interface shared by all tokenizers; subclasses set ``vocab_size``, ``eod`` and ``pad``."""

    vocab_size: int
    eod: int
    pad: int

    def tokenize(self, text: str) -> list[int]:
        """Returns the ids of ``text`` (no special ids added)."""
        raise NotImplementedError

    def detokenize(self, ids: Sequence[int]) -> str:
        """Returns the text of ``ids``."""
        raise NotImplementedError

    def role_marker(self, role: str) -> list[int]:
        """Returns the ids that open a chat turn of ``role`` (empty: no marker)."""
        return []

    def encode_chat(self, turns: list[tuple[str, str]]):
        """``(ids, is_target)`` of a conversation rendered by the tokenizer's own chat
        template, or None when it has none (the SFT dataset then uses role markers)."""
        return None


class NullTokenizer(Tokenizer):
    """Ids written as text: ``"5 17 3"`` <-> ``[5, 17, 3]``; ``eod = pad = vocab_size - 1``.

    Args:
        vocab_size: Number of ids, at least 2 (one content id plus eod).
    """

    def __init__(self, vocab_size: int | None):
        if vocab_size is None or vocab_size < 2:
            raise ValueError(f"NullTokenizer needs --vocab-size >= 2, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self.eod = self.vocab_size - 1
        self.pad = self.eod

    def tokenize(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if not (word.isascii() and word.isdigit()) or int(word) >= self.vocab_size:
                raise ValueError(
                    f"NullTokenizer: {word!r} is not an id in [0, {self.vocab_size}) "
                    "(--vocab-size)"
                )
            ids.append(int(word))
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


class ByteLevelTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then eod, pad and the three chat role ids."""

    def __init__(self):
        self.vocab_size = BYTE_VOCAB_SIZE
        self.eod = BYTE_EOD
        self.pad = BYTE_PAD

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, ids: Sequence[int]) -> str:
        """Decodes bytes; special ids are rendered as ``<|name|>``; bad UTF-8 as U+FFFD."""
        parts: list[str] = []
        pending = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < NUM_BYTES:
                pending.append(i)
                continue
            if i not in _BYTE_SPECIAL_NAMES:
                raise ValueError(f"ByteLevelTokenizer: id {i} is not in [0, {self.vocab_size})")
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            parts.append(f"<|{_BYTE_SPECIAL_NAMES[i]}|>")
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def role_marker(self, role: str) -> list[int]:
        return [BYTE_ROLE_IDS[role]]


class HuggingFaceTokenizer(Tokenizer):
    """Adapter around a ``transformers`` tokenizer object.

    ``eod`` is the tokenizer's eos id; ``pad`` its pad id, or eod when it has none;
    ``vocab_size`` is ``len(tokenizer)`` (base vocabulary plus added tokens). A chat turn opens
    with the text ``<|role|>\\n`` tokenized as ordinary text.

    Args:
        hf_tokenizer: Object with ``encode``, ``decode``, ``__len__``, ``eos_token_id`` and
            ``pad_token_id`` (a ``PreTrainedTokenizer`` or a test double).
    """

    def __init__(self, hf_tokenizer):
        if hf_tokenizer.eos_token_id is None:
            raise ValueError(
                "HuggingFaceTokenizer: the --tokenizer-model tokenizer has no eos token"
            )
        self._hf = hf_tokenizer
        self.vocab_size = len(hf_tokenizer)
        self.eod = int(hf_tokenizer.eos_token_id)
        pad = hf_tokenizer.pad_token_id
        self.pad = self.eod if pad is None else int(pad)
        assert self.eod < self.vocab_size and self.pad < self.vocab_size

    @classmethod
    def from_pretrained(cls, path: str | None) -> "HuggingFaceTokenizer":
        """Loads the local tokenizer directory ``path`` offline (no download)."""
        if path is None or not os.path.isdir(path):
            raise ValueError(
                f"HuggingFaceTokenizer: --tokenizer-model {path!r} is not a local tokenizer "
                "directory"
            )
        try:
            import transformers  # heavy and optional: only this tokenizer needs it
        except ImportError as err:
            raise ValueError(
                f"HuggingFaceTokenizer needs the transformers package to load "
                f"--tokenizer-model {path!r}: pip install transformers"
            ) from err
        return cls(transformers.AutoTokenizer.from_pretrained(path, local_files_only=True))

    def tokenize(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False))

    def text_to_ids(self, text: str, include_special_tokens: bool) -> list[int]:
        """Megatron-LM's text -> ids (megatron-core's HuggingFaceTokenizer.text_to_ids, what
        its tools/preprocess_data.py writes): with ``include_special_tokens`` the tokenizer's
        own call (``tokenizer(text).input_ids``: a BOS where its post-processor adds one),
        else its tokens converted to ids."""
        if include_special_tokens:
            return list(self._hf(text).input_ids)
        return list(self._hf.convert_tokens_to_ids(self._hf.tokenize(text)))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._hf.decode(list(ids))

    def role_marker(self, role: str) -> list[int]:
        return self.tokenize(HF_ROLE_MARKER_FORMAT.format(role=role))

    def has_chat_template(self) -> bool:
        """Whether SFT conversations render with the tokenizer's own chat template (else with
        this fork's plain ``<|role|>\\n`` markers)."""
        return getattr(self._hf, "chat_template", None) is not None

    def encode_chat(self, turns: list[tuple[str, str]]):
        if not self.has_chat_template():
            return None
        from megatron.varlen_training.hf.chat_template import encode_chat

        return encode_chat(self._hf, turns)


class LibraryTokenizer(Tokenizer):
    """Adapter around a megatron-core text tokenizer library object (its SentencePiece and
    TikToken tokenizers): ids are its ``text_to_ids``, as Megatron-LM's ``tokenize``;
    ``eod`` its eod; ``pad`` its pad id, or eod when it has none (-1); ``vocab_size`` its own.
    A chat turn opens with the text ``<|role|>\\n``, as for Hugging Face tokenizers without a
    chat template.

    Args:
        library: Object with ``text_to_ids``, ``ids_to_text``, ``vocab_size``, ``eod`` and
            ``pad_id`` (``megatron.core.tokenizers.text.libraries``).
        decode: ids -> text, where the library's ``ids_to_text`` will not do (None: it).
    """

    def __init__(self, library, decode=None):
        self._library = library
        self._decode = decode or library.ids_to_text
        self.vocab_size = int(library.vocab_size)
        self.eod = int(library.eod)
        pad = int(library.pad_id)
        self.pad = self.eod if pad == NO_ID else pad
        assert 0 <= self.eod < self.vocab_size and 0 <= self.pad < self.vocab_size

    def tokenize(self, text: str) -> list[int]:
        return [int(i) for i in self._library.text_to_ids(text)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._decode([int(i) for i in ids])

    def role_marker(self, role: str) -> list[int]:
        return self.tokenize(HF_ROLE_MARKER_FORMAT.format(role=role))

    def hf_token_ids(self) -> dict[str, int | None]:
        """The model's own bos/eos/pad ids for an exported ``config.json`` (None where it has
        none: a SentencePiece model without a pad piece has no pad, not the eod)."""
        ids = (self._library.bos_id, self._library.eos_id, self._library.pad_id)
        return {name: None if int(i) == NO_ID else int(i)
                for name, i in zip(("bos_token_id", "eos_token_id", "pad_token_id"), ids)}


def check_tokenizer_fits(tokenizer: Tokenizer, vocab_size: int, tokenizer_type: str) -> None:
    """Every id the tokenizer returns must have a row in the model's vocabulary; the refusal
    names the flags that chose the tokenizer (``tokenizer_type``'s)."""
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is "
            f"{vocab_size} (--vocab-size, or the --hf-checkpoint's vocab_size): use a matching "
            f"tokenizer ({tokenizer_flags(tokenizer_type)})")


def build_tokenizer(
    tokenizer_type: str, vocab_size: int | None = None, tokenizer_model: str | None = None,
    vocab_file: str | None = None, merge_file: str | None = None,
    options: ModelFileOptions = ModelFileOptions(),
) -> Tokenizer:
    """Builds the tokenizer named by ``--tokenizer-type``.

    Args:
        tokenizer_type: One of :data:`TOKENIZER_TYPES`.
        vocab_size: ``--vocab-size``; required by ``NullTokenizer``, the vocabulary of
            ``TikTokenizer`` (None: 2^17), ignored otherwise.
        tokenizer_model: ``--tokenizer-model``; the local directory for ``HuggingFaceTokenizer``,
            the model file of the SentencePiece types and ``TikTokenizer``.
        vocab_file: ``--vocab-file``; GPT-2's vocabulary JSON for ``GPT2BPETokenizer``.
        merge_file: ``--merge-file``; GPT-2's merges file for ``GPT2BPETokenizer``.
        options: the flags of the SentencePiece types and ``TikTokenizer`` besides
            ``--tokenizer-model`` (``--tiktoken-*``, ``--tokenizer-special-tokens``, ...).

    Returns:
        The tokenizer.

    Raises:
        ValueError: Unknown type, or a missing/invalid argument for the chosen type.
    """
    if tokenizer_type == "NullTokenizer":
        return NullTokenizer(vocab_size)
    if tokenizer_type == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer.from_pretrained(tokenizer_model)
    if tokenizer_type == GPT2_BPE_TYPE:
        return HuggingFaceTokenizer(gpt2_bpe_backend(vocab_file, merge_file))
    if tokenizer_type in SENTENCEPIECE_TYPES:
        return LibraryTokenizer(sentencepiece_library(tokenizer_type, tokenizer_model,
                                                      options.ignore_extra_whitespaces))
    if tokenizer_type == TIKTOKEN_TYPE:
        library = tiktoken_library(tokenizer_model, vocab_size, options)
        # tiktoken's own decode: megatron-core's ids_to_text decodes each token alone, which
        # garbles a character whose bytes two tokens share.
        return LibraryTokenizer(library, decode=library.tokenizer.decode)
    reason = unavailable_reason(tokenizer_type)
    if reason is not None:
        raise ValueError(reason)
    raise ValueError(
        f"unknown --tokenizer-type {tokenizer_type!r}; choose one of {', '.join(TOKENIZER_TYPES)}"
    )


def tokenizer_flags(tokenizer_type: str) -> str:
    """The flags that chose this run's ids, e.g. ``--tokenizer-type GPT2BPETokenizer,
    --vocab-file, --merge-file``: the hint of a refusal of data made with another tokenizer."""
    flags = TOKENIZER_TYPE_FLAGS.get(tokenizer_type, ())
    return ", ".join((f"--tokenizer-type {tokenizer_type}", *flags))


def build_run_tokenizer(data, vocab_size: int | None) -> Tokenizer:
    """The tokenizer of a run's :class:`~megatron.varlen_training.config.data.DataConfig`
    (``vocab_size``: the model's ``--vocab-size``, or the ``--hf-checkpoint``'s)."""
    return build_tokenizer(data.tokenizer_type, vocab_size, data.tokenizer_model,
                           data.vocab_file, data.merge_file, ModelFileOptions.of(data))
