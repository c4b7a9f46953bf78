"""``gpt_sft``: supervised fine-tuning samples in four forms, with prompt masking and truncation.

A sample is one of (first match wins):

- ``{"tokens", "labels", "loss_mask"?, "length"?}``: a data-path sample, as the datasets
  yield it (labels already shifted; see :meth:`Flow.build_sample`);
- ``{"prompt_ids": [...], "response_ids": [...]}``: token ids; only response ids are trained on
  as labels (prompt masking);
- ``{"input_ids": [...], "context_token_length": k}`` (megatron-wrap's SFT form): the first
  ``k`` ids are the prompt, only the ids after them are trained on as labels;
- ``{"input_ids": [...]}``: token ids, every label trained on;
- ``{"prompt": str, "response": str}`` or ``{"messages": [{"role", "content"}, ...]}``: text,
  tokenized with the chat template of the JSONL SFT dataset (``datasets/sft.py``): only
  assistant content and its closing eod are trained on. The keys are the run's
  ``--sft-prompt-key``, ``--sft-response-key`` and ``--sft-messages-key`` (config keys
  ``sft_prompt_key``, ...), as the dataset reads them.

A key the sample's form does not read (``labels`` beside ``prompt``/``response``, ``length``
beside ``input_ids``, a mistyped ``loss_maks``) is a one-line error rather than dropped; keys
that are metadata (ids, source names) are named in config key ``flow.ignored_fields``. Extra
fields the flow declares (``fields_and_seq_dims``) are read in every form.

The loss is the global per-token mean (``pretrain_gpt.py``'s). ``flow_args:
{loss_normalization: sample}`` makes it the mean over samples of each sample's per-token mean
(megatron-wrap's SFT loss): each trained token gets the weight ``N / (S * n_s)`` (``N`` trained
tokens and ``S`` samples with any in the global batch, ``n_s`` in its sample), packed like
``loss_mask``, so megatron-core's division by ``N`` leaves exactly that mean, whatever the
packing and layout.

A document of ``n`` ids is a sample of ``n - 1`` tokens (token t predicts id t + 1). Samples
longer than the run can take are cut to the limit and counted (``num_truncated``; a warning
the first time; set ``flow_args: {truncate: false}`` to get an error instead). Fully masked
samples (nothing to train on) are kept; they add nothing to the loss and never give a NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral

import numpy as np
import torch

from megatron.varlen_training.datasets.sample import make_sample

# The chat template of the JSONL SFT dataset, reused so both paths tokenize text identically.
from megatron.varlen_training.datasets.sft import encode_turns, parse_turns, sft_keys
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.training import LOSS_KEY
from megatron.wrap.config.errors import ConfigError
from megatron.wrap.flows import fields
from megatron.wrap.flows.gpt import GPTFlow
from megatron.wrap.flows.registry import register_flow

MIN_DOCUMENT_IDS = 2  # one input token and its label
_ID_FORMS = "tokens+labels, prompt_ids+response_ids, input_ids(+context_token_length)"
CONTEXT_LENGTH_KEY = "context_token_length"  # megatron-wrap's name for the prompt's length
LOSS_WEIGHT = "loss_weight"  # per-token weight of the per-sample normalisation
NORMALIZATIONS = ("token", "sample")


@register_flow("gpt_sft")
class GPTSFTFlow(GPTFlow):
    """GPT SFT on prompt/response samples (module docstring).

    Args:
        context: The run.
        truncate: Cut over-long samples to the limit (counted, warned about once); False
            raises a ValueError naming the sample instead.
        loss_normalization: ``token`` (the global per-token mean) or ``sample`` (the mean of
            the samples' per-token means; module docstring).
    """

    def __init__(self, context, truncate: bool = True, loss_normalization: str = "token"):
        super().__init__(context)
        if loss_normalization not in NORMALIZATIONS:
            raise ConfigError(f"flow 'gpt_sft': flow.flow_args.loss_normalization "
                             f"{loss_normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
        self.per_sample = loss_normalization == "sample"
        self.computed_fields = (LOSS_WEIGHT,) if self.per_sample else ()
        self.truncate = bool(truncate)
        self.text_keys = sft_keys(context.run.data)  # --sft-messages-key, ... as the dataset
        keys = self.text_keys
        self.forms = f"{_ID_FORMS}, {keys.prompt}+{keys.response} or {keys.messages}"
        # Running counts over every batch this flow converted (on rank 0 only with "rank0").
        self.num_samples = self.num_truncated = self.num_fully_masked = 0

    def fields_and_seq_dims(self) -> dict[str, int | None]:
        fields_ = super().fields_and_seq_dims()
        return {**fields_, LOSS_WEIGHT: 0} if self.per_sample else fields_

    def build_samples(self, batch: Sequence[Mapping]) -> list[dict]:
        samples = super().build_samples(batch)
        self._warn_counts(samples)
        if self.per_sample:
            add_sample_weights(samples)
        return samples

    def collate_micro_batch(self, micro_batch: dict) -> tuple[dict, dict]:
        model_inputs, loss_inputs = super().collate_micro_batch(micro_batch)
        if self.per_sample:
            loss_inputs[LOSS_WEIGHT] = micro_batch[LOSS_WEIGHT]
        return model_inputs, loss_inputs

    def loss(self, output: torch.Tensor, loss_inputs: dict):
        """Per token: ``GPTFlow.loss``. Per sample: the weighted sum, with the token count kept
        an integer (megatron-core sums the counts as ints and divides the gradients by them)."""
        if not self.per_sample:
            return super().loss(output, loss_inputs)
        weights = loss_inputs[LOSS_WEIGHT].float().reshape(-1)
        loss_sum = torch.sum(output.float().reshape(-1) * weights)
        num_tokens = loss_inputs["loss_mask"].float().sum().to(torch.int)
        report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
        return loss_sum, num_tokens, {LOSS_KEY: report}

    def build_sample(self, raw: Mapping, index: int) -> dict:
        if "tokens" in raw:
            sample = super().build_sample(raw, index)
        else:
            sample = self._sample_from_document(raw, index)
        return self._truncated(sample) if self.truncate else sample

    def _sample_from_document(self, raw: Mapping, index: int) -> dict:
        ids, is_target, reads = self._document(raw, index)
        if ids.size < MIN_DOCUMENT_IDS:
            raise fields.sample_error(index, None, f"has {ids.size} token id(s); at least "
                                                   f"{MIN_DOCUMENT_IDS} are needed (a token "
                                                   f"and its label)")
        made = make_sample(ids, is_target, index, self.context.tokenizer.pad)
        length = made["length"]
        sample = {key: made[key][:length] for key in ("tokens", "labels", "loss_mask")}
        sample["length"] = length
        sample.update(self.build_extra_fields(raw, index, length))
        self.refuse_unread(raw, index, reads)
        return sample

    def _document(self, raw: Mapping, index: int
                  ) -> tuple[np.ndarray, np.ndarray | None, tuple[str, ...]]:
        """``(ids, is_target, the keys this form reads)`` of a document form; is_target None
        trains on every label."""
        vocab = self.context.run.model.vocab_size
        if "prompt_ids" in raw or "response_ids" in raw:
            reads = ("prompt_ids", "response_ids")
            prompt, response = (
                fields.as_token_ids(fields.require_field(raw, index, key, self.forms), index,
                                    key, vocab).numpy()
                for key in reads)
            is_target = np.concatenate([np.zeros(prompt.size, bool), np.ones(response.size, bool)])
            return np.concatenate([prompt, response]), is_target, reads
        if "input_ids" in raw:
            reads = ("input_ids", CONTEXT_LENGTH_KEY)
            ids = fields.as_token_ids(raw["input_ids"], index, "input_ids", vocab).numpy()
            if raw.get(CONTEXT_LENGTH_KEY) is None:
                return ids, None, reads
            prompt = _context_length(raw[CONTEXT_LENGTH_KEY], ids.size, index)
            return ids, np.arange(ids.size) >= prompt, reads
        keys = self.text_keys
        if keys.messages in raw:  # parse_turns reads the messages, and then nothing else
            return (*self._encode_text(raw, index), (keys.messages,))
        if keys.prompt in raw:
            return (*self._encode_text(raw, index), (keys.prompt, keys.response))
        raise fields.sample_error(index, None, f"has fields {', '.join(map(repr, raw))}; "
                                               f"flow 'gpt_sft' reads one of: {self.forms}")

    def _encode_text(self, raw: Mapping, index: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            ids, is_target = encode_turns(parse_turns(dict(raw), self.text_keys),
                                          self.context.tokenizer)
        except ValueError as err:  # the dataset's message, located in the batch
            raise fields.sample_error(index, None, str(err)) from None
        fields.as_token_ids(ids, index, "text (tokenized)", self.context.run.model.vocab_size)
        return ids, is_target

    def _truncated(self, sample: dict) -> dict:
        limit = self.context.max_length
        if sample["length"] <= limit:
            return sample
        cut = {key: value[:limit] if hasattr(value, "shape") and value.dim() else value
               for key, value in sample.items()}
        cut["length"] = limit
        cut["truncated_from"] = sample["length"]
        return cut

    def _warn_counts(self, samples: list[dict]) -> None:
        """Counts truncated and fully masked samples; warns on the first batch that has any
        (later ones only add to the counters, so long runs are not flooded)."""
        truncated = [s.pop("truncated_from") for s in samples if "truncated_from" in s]
        masked = sum(1 for s in samples if not bool(s["loss_mask"].any()))
        if truncated and not self.num_truncated:
            warning_rank_0(
                "gpt_sft: %d of %d samples were longer than %d tokens (config key %r) and were "
                "truncated (longest %d); set flow.flow_args.truncate: false to get an error. "
                "Later truncations are only counted (flow.num_truncated)",
                len(truncated), len(samples), self.context.max_length,
                self.context.max_length_key, max(truncated))
        if masked and not self.num_fully_masked:
            warning_rank_0("gpt_sft: %d of %d samples have no token to train on (loss_mask all "
                           "0); they add nothing to the loss. Later ones are only counted "
                           "(flow.num_fully_masked)", masked, len(samples))
        self.num_samples += len(samples)
        self.num_truncated += len(truncated)
        self.num_fully_masked += masked


def _context_length(value, num_ids: int, index: int) -> int:
    """``context_token_length`` checked: an int in ``[0, len(input_ids)]``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value <= num_ids:
        raise fields.sample_error(index, CONTEXT_LENGTH_KEY,
                                  f"{value!r} must be an int in [0, {num_ids}] (the number of "
                                  f"input_ids that are prompt)")
    return value


def add_sample_weights(samples: list[dict]) -> None:
    """Gives every sample its ``loss_weight``: ``N / (S * n_s)`` on trained tokens, else 0."""
    counts = [float(sample["loss_mask"].sum()) for sample in samples]
    trained = sum(counts)
    num_samples = sum(1 for count in counts if count > 0)
    for sample, count in zip(samples, counts):
        scale = trained / (num_samples * count) if count > 0 else 0.0
        sample[LOSS_WEIGHT] = sample["loss_mask"].to(torch.float64).mul(scale).float()
