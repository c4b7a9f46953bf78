"""Supervised fine-tuning data from a JSONL file (``--sft --data-path FILE``).

Each non-blank line is one sample, either a conversation or a prompt/response pair::

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
    {"prompt": "...", "response": "..."}

A pair is the conversation ``[user: prompt, assistant: response]``. A HuggingFaceTokenizer with
a chat template renders the conversation with it (loss on the assistant turns' tokens, found in
the rendered text). Otherwise the template: every turn is
``role_marker(role) + tokenize(content) + [eod]`` and the document is the concatenation of the
turns. Only the content and closing eod of assistant turns are trained on: ``loss_mask[i]`` is 1
exactly when ``labels[i]`` is one of those ids, so system/user text and all role markers are
masked. A document of more than ``seq_length + 1`` ids is truncated to ``seq_length + 1`` (real
length ``seq_length``); a sample left without any trained label is kept, with
``num_loss_tokens == 0``. Both counts are logged once. Keys that would change what trains but
are not read (pre-tokenised ``labels``/``input_ids``, a message's ``tool_calls`` or a disagreeing
``weight``) are refused (:mod:`megatron.varlen_training.datasets.sft_unread`).
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass

import numpy as np
import torch

from megatron.varlen_training.datasets.jsonl_lines import decode_line
from megatron.varlen_training.datasets.sample import make_sample
from megatron.varlen_training.datasets.sft_unread import (
    refuse_pretokenized, refuse_unread_message_keys,
)
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.tokenizer import CHAT_ROLES, TRAINED_ROLE, Tokenizer


SYSTEM_ROLE = "system"
# Megatron-LM's SFT dataset starts a new conversation at every system message of a line (several
# conversations packed in one list); read as one conversation here it would attend across them.
MID_CONVERSATION_SYSTEM = (
    "turn {turn} is a system message after the conversation's start, which Megatron-LM's SFT "
    "reads as the start of another conversation in the same record; give each conversation "
    "its own record (a system message comes first)")
MIN_DOCUMENT_IDS = 2  # one input token plus its label


@dataclass(frozen=True)
class SFTKeys:
    """Where a record keeps its conversation: the JSONL key or Parquet/Arrow column of the
    messages (``--sft-messages-key``), or of the prompt and the response
    (``--sft-prompt-key``, ``--sft-response-key``). A message is ``{"role", "content"}``."""

    messages: str = "messages"
    prompt: str = "prompt"
    response: str = "response"


def sft_keys(data) -> SFTKeys:
    """The keys a run's ``DataConfig`` names (``--sft-messages-key``, ``--sft-prompt-key``,
    ``--sft-response-key``)."""
    return SFTKeys(data.sft_messages_key, data.sft_prompt_key, data.sft_response_key)


def parse_turns(record, keys: SFTKeys = SFTKeys()) -> list[tuple[str, str]]:
    """Returns ``[(role, content), ...]`` of one record (a JSON object, or a Parquet/Arrow row
    as a dict); ValueError names the problem."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if keys.messages in record:
        messages = record[keys.messages]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{keys.messages!r} must be a non-empty list")
        turns = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ValueError(f"message {i} is not an object")
            refuse_unread_message_keys(message, i)
            turns.append((message.get("role"), message.get("content")))
    elif keys.prompt in record and keys.response in record:
        turns = [("user", record[keys.prompt]), ("assistant", record[keys.response])]
    else:
        raise ValueError(f"expected a {keys.messages!r} key or both {keys.prompt!r} and "
                         f"{keys.response!r} keys (--sft-messages-key, --sft-prompt-key, "
                         f"--sft-response-key); its keys are {', '.join(map(repr, record))}")
    for i, (role, content) in enumerate(turns):
        if role not in CHAT_ROLES:
            raise ValueError(f"turn {i} has role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        if role == SYSTEM_ROLE and i > 0:
            raise ValueError(MID_CONVERSATION_SYSTEM.format(turn=i))
        if not isinstance(content, str):
            raise ValueError(f"turn {i} content must be a string, got {type(content).__name__}")
    return turns


def encode_turns(turns: list[tuple[str, str]], tokenizer: Tokenizer):
    """Applies the template; returns ``(ids, is_target)`` numpy arrays of equal length.

    A tokenizer with its own chat template (HuggingFaceTokenizer) renders the conversation
    itself and marks the assistant tokens (``Tokenizer.encode_chat``).
    """
    rendered = tokenizer.encode_chat(turns)
    if rendered is not None:
        return rendered
    ids: list[int] = []
    is_target: list[bool] = []
    for role, content in turns:
        marker = tokenizer.role_marker(role)
        body = tokenizer.tokenize(content) + [tokenizer.eod]
        ids += marker + body
        is_target += [False] * len(marker) + [role == TRAINED_ROLE] * len(body)
    return np.asarray(ids, dtype=np.int64), np.asarray(is_target, dtype=bool)


def _load_documents(path: str, tokenizer: Tokenizer, keys: SFTKeys):
    """Reads and encodes every non-blank line of ``path``; returns a list of (ids, is_target)."""
    documents = []
    if os.path.isdir(path):
        raise ValueError(f"--data-path {path!r} is a directory; --sft needs a JSONL file")
    try:
        with open(path, "rb") as f:  # bytes: a bad byte is reported with its line number
            for line_number, raw in enumerate(f, start=1):
                line = decode_line(f"{path}:{line_number}", line_number, raw)
                if line.strip():
                    documents.append(_encode_line(path, line_number, line, tokenizer, keys))
    except FileNotFoundError as err:
        raise ValueError(f"SFT data file {path!r} does not exist (--data-path)") from err
    except PermissionError as err:
        raise ValueError(f"SFT data file {path!r} is not readable (--data-path)") from err
    if not documents:
        raise ValueError(f"SFT data file {path!r} has no samples (--data-path)")
    return documents


def _encode_line(path: str, line_number: int, line: str, tokenizer: Tokenizer, keys: SFTKeys):
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from err
    except RecursionError as err:  # json's parser recurses once per nested array/object
        raise ValueError(f"{where}: JSON nested too deeply to read (a chat sample needs 3 "
                         f"levels)") from err
    except ValueError as err:  # e.g. an integer over Python's digit limit
        raise ValueError(f"{where}: invalid JSON: {err}") from err
    return encode_record(record, tokenizer, keys, where)


def encode_record(record, tokenizer: Tokenizer, keys: SFTKeys, where: str):
    """One record's ``(ids, is_target)``; a ValueError starts with ``where`` (``file:line``,
    ``file row N``)."""
    try:
        turns = parse_turns(record, keys)
        refuse_pretokenized(record)
        ids, is_target = encode_turns(turns, tokenizer)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    if len(ids) < MIN_DOCUMENT_IDS:
        raise ValueError(f"{where}: sample has {len(ids)} token(s), at least 2 are needed")
    return ids, is_target


def truncate(ids: np.ndarray, is_target: np.ndarray, seq_length: int):
    """A document cut to ``seq_length + 1`` ids (real length ``seq_length``)."""
    return ids[: seq_length + 1], is_target[: seq_length + 1]


class SFTDataset(torch.utils.data.Dataset):
    """One sample per JSONL line, in file order (see the module docstring for the template).

    The whole file is read and tokenized on construction.

    Args:
        path: JSONL file.
        tokenizer: Tokenizer (``megatron.varlen_training.tokenizer``).
        seq_length: Longest real length (``--seq-length``); longer samples are truncated.
        pad_to_multiple_of: The padded length is the real length rounded up to this.
        pad_to_seq_length: Pad every sample to exactly ``seq_length`` instead (unpacked runs).
        keys: Where each line keeps its conversation (:class:`SFTKeys`).

    Attributes:
        lengths: int64 array of real lengths.
        num_truncated: Samples cut to ``seq_length``.
        num_fully_masked: Samples with no trained label (``num_loss_tokens == 0``).
    """

    def __init__(
        self,
        path: str,
        tokenizer: Tokenizer,
        seq_length: int,
        pad_to_multiple_of: int = 1,
        pad_to_seq_length: bool = False,
        keys: SFTKeys = SFTKeys(),
    ):
        if seq_length < 1:
            raise ValueError(f"--seq-length must be >= 1, got {seq_length}")
        documents = _load_documents(path, tokenizer, keys)
        self.num_truncated = sum(len(ids) > seq_length + 1 for ids, _ in documents)
        self._documents = [truncate(ids, t, seq_length) for ids, t in documents]
        self.lengths = np.array([len(ids) - 1 for ids, _ in self._documents], dtype=np.int64)
        self.num_fully_masked = sum(not t[1:].any() for _, t in self._documents)
        self._pad = tokenizer.pad
        self._pad_to_multiple_of = pad_to_multiple_of
        self._padded_length = seq_length if pad_to_seq_length else None
        self._log_counts(path, seq_length)

    def _log_counts(self, path: str, seq_length: int):
        if self.num_truncated:
            warning_rank_0(
                "SFTDataset: %d of %d samples in %s are longer than --seq-length %d and were "
                "truncated",
                self.num_truncated,
                len(self),
                path,
                seq_length,
            )
        if self.num_fully_masked:
            warning_rank_0(
                "SFTDataset: %d of %d samples in %s have no assistant/response token to train on "
                "(loss_mask all 0)",
                self.num_fully_masked,
                len(self),
                path,
            )

    def __len__(self) -> int:
        return len(self._documents)

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        ids, is_target = self._documents[idx]
        return make_sample(
            ids, is_target, idx, self._pad, self._pad_to_multiple_of, self._padded_length
        )
