"""The flow protocol: how user samples become model inputs and a loss.

A flow has four jobs, called by :class:`megatron.wrap.MegatronWrap` in this order:

1. :meth:`Flow.build_samples` turns the user's batch into *data-path samples*
   (``{"tokens", "labels", "loss_mask", "length"}`` plus the flow's extra fields), the format
   the packing path of ``pretrain_gpt.py`` consumes. Field checks raise one-line errors; so
   does a key the flow does not read (:meth:`Flow.refuse_unread`: never dropped silently).
2. The facade (not the flow) splits the batch over DP, packs it into THD micro-batches,
   splits sequences for context parallelism and packs the flow's extra fields the same way
   (:meth:`Flow.fields_and_seq_dims` says which fields exist and where their sequence is).
3. :meth:`Flow.collate_micro_batch` turns one packed micro-batch into
   ``(model inputs, loss inputs)``; the model is called as ``model(**model_inputs)``.
4. :meth:`Flow.loss` returns megatron-core's 3 values ``(loss_sum, num_tokens, metrics)``: the
   SUM of this micro-batch's token losses and its token count, so that the global per-token
   mean is exact whatever the packing, DP and CP layout (the facade and megatron-core divide
   by the global count). ``metrics`` maps each name of :attr:`Flow.metric_names` to a
   ``tensor([sum, count])``; the facade reports ``sum / count`` over the global batch. The
   name ``"lm loss"`` is required: it is the loss the training path reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.training import LOSS_KEY
from megatron.wrap.flows import fields

# Fields the packing path itself moves, packs and CP-splits (sequence dim 0 of a sample).
CORE_FIELDS = {"tokens": 0, "labels": 0, "loss_mask": 0}
PER_SAMPLE = None  # the "sequence dim" of a field that holds one value per sample
# What build_sample reads from a data-path sample (position_ids only to check them).
DATA_PATH_READS = ("tokens", "labels", "loss_mask", "length", "position_ids")
# The datasets' bookkeeping (datasets/sample.py SAMPLE_KEYS): derived from the fields above, so
# a data-path sample may carry them unread.
DATASET_BOOKKEEPING = ("padded_length", "sample_id", "num_loss_tokens")
IGNORED_FIELDS_KEY = "flow.ignored_fields"


@dataclass(frozen=True)
class FlowContext:
    """What a flow may read about the run.

    Attributes:
        run: The run's configuration (``megatron.varlen_training.config.RunConfig``).
        tokenizer: The run's tokenizer (``megatron.varlen_training.tokenizer``).
        max_length: Longest real sample length the run can take (tokens).
        max_length_key: The config key that sets ``max_length`` (named in errors).
        ignored_fields: Sample keys the flow accepts without reading them (config key
            ``flow.ignored_fields``), added to the flow's own :attr:`Flow.ignored_fields`.
    """

    run: RunConfig
    tokenizer: Any
    max_length: int
    max_length_key: str
    ignored_fields: tuple[str, ...] = ()
    """Sample keys the config passes over unread (config key ``flow.ignored_fields``)."""


class Flow:
    """Base class of flows; see the module docstring for the protocol.

    Subclasses set :attr:`name` through :func:`megatron.wrap.register_flow`, implement
    :meth:`collate_micro_batch` and :meth:`loss`, and may extend :meth:`fields_and_seq_dims`
    and :meth:`build_sample`. Keyword arguments of ``__init__`` after ``context`` are the
    config's ``flow.flow_args``.

    Args:
        context: The run (:class:`FlowContext`).
    """

    name: str = ""
    metric_names: tuple[str, ...] = (LOSS_KEY,)
    computed_fields: tuple[str, ...] = ()
    """Extra fields the flow fills in itself (in ``build_samples``), not read from samples."""
    ignored_fields: tuple[str, ...] = ()
    """Sample keys the flow accepts and deliberately does not read (metadata such as ids or
    source names). Any other key a sample carries and the flow does not read is a
    ``BatchError`` (:meth:`refuse_unread`); config key ``flow.ignored_fields`` adds to these."""

    def __init__(self, context: FlowContext):
        self.context = context

    def fields_and_seq_dims(self) -> dict[str, int | None]:
        """Fields of a data-path sample and their sequence dim (None: one value per sample).

        ``tokens``, ``labels`` and ``loss_mask`` travel through the packing path; any other
        per-token field (dim 0, float values) is packed and CP-split like ``loss_mask`` and a
        per-sample field (None) is given per micro-batch as a ``[n]`` tensor in pack order.
        """
        return dict(CORE_FIELDS)

    def extra_fields(self) -> dict[str, int | None]:
        """The fields of :meth:`fields_and_seq_dims` that the facade packs itself."""
        extra = {k: v for k, v in self.fields_and_seq_dims().items() if k not in CORE_FIELDS}
        for field, dim in extra.items():
            if dim not in (0, PER_SAMPLE):
                raise ValueError(f"flow {self.name!r}: field {field!r} has sequence dim {dim}; "
                                 f"samples are 1-D per token (dim 0) or one value (None)")
        return extra

    def build_samples(self, batch: Sequence[Mapping]) -> list[dict]:
        """Converts the user's batch; sample ``i`` is built by ``build_sample(batch[i], i)``."""
        samples = []
        for index, raw in enumerate(batch):
            if not isinstance(raw, Mapping):
                raise fields.sample_error(index, None, f"expected a dict of fields, got "
                                                       f"{type(raw).__name__}")
            samples.append(self.build_sample(raw, index))
        return samples

    def build_sample(self, raw: Mapping, index: int) -> dict:
        """One data-path sample from a dict in the same format (what the datasets yield).

        Reads ``tokens`` and ``labels`` (ids), optional ``loss_mask`` (default all 1) and
        ``length`` (default ``len(tokens)``; only the first ``length`` entries are used), plus
        the extra fields of :meth:`fields_and_seq_dims`. Every per-token field has one entry
        per token: ``length`` entries, or as many as ``tokens`` (padded alike). Optional
        ``position_ids`` must be ``0 .. length - 1`` (what packing uses); the datasets'
        bookkeeping (``padded_length``, ``sample_id``, ``num_loss_tokens``) is accepted unread;
        any other key is refused (:meth:`refuse_unread`).
        """
        reads = "tokens, labels, optional loss_mask and length"
        vocab = self.context.run.model.vocab_size
        tokens = fields.as_token_ids(fields.require_field(raw, index, "tokens", reads),
                                     index, "tokens", vocab)
        length = fields.as_length(raw.get("length", tokens.numel()), index, tokens.numel())
        labels = fields.as_token_ids(fields.require_field(raw, index, "labels", reads),
                                     index, "labels", vocab)
        mask = raw.get("loss_mask")
        mask = torch.ones(length) if mask is None else \
            fields.require_binary(fields.as_per_token_values(mask, index, "loss_mask"), index,
                                  "loss_mask")
        padded = tokens.numel()  # per-token fields may carry the same padding as tokens
        if raw.get("position_ids") is not None:
            fields.require_positions(raw["position_ids"], index, length, padded)
        sample = {
            "tokens": tokens[:length],
            "labels": fields.require_entries(labels, length, index, "labels", padded),
            "loss_mask": fields.require_entries(mask, length, index, "loss_mask", padded),
            "length": length,
        }
        sample.update(self.build_extra_fields(raw, index, length, padded))
        self.refuse_unread(raw, index, DATA_PATH_READS, DATASET_BOOKKEEPING)
        return sample

    def sample_fields(self) -> tuple[str, ...]:
        """The extra fields (:meth:`extra_fields`) read from every sample (not computed)."""
        return tuple(field for field in self.extra_fields() if field not in self.computed_fields)

    def refuse_unread(self, raw: Mapping, index: int, form_reads: Sequence[str],
                      accepted: Sequence[str] = ()) -> None:
        """A one-line ``BatchError`` if ``raw`` holds a key the flow does not read: neither one
        of ``form_reads`` (what this sample's form reads) or :meth:`sample_fields`, nor
        ``accepted`` or an ignored field (:attr:`ignored_fields`, ``flow.ignored_fields``).
        Call it from a ``build_sample`` of your own with the keys it read."""
        fields.refuse_unread(raw, index, (*form_reads, *self.sample_fields()),
                             (*accepted, *self.ignored_fields, *self.context.ignored_fields),
                             self.name or type(self).__qualname__, IGNORED_FIELDS_KEY)

    def build_extra_fields(self, raw: Mapping, index: int, length: int,
                           padded_length: int | None = None) -> dict:
        """The extra fields (see :meth:`extra_fields`) of one sample, checked: a per-token
        field has exactly ``length`` entries (or ``padded_length``, the padded size of
        ``tokens`` in the data-path form)."""
        out = {}
        for field, dim in self.extra_fields().items():
            if field in self.computed_fields:
                continue
            value = fields.require_field(raw, index, field, ", ".join(self.fields_and_seq_dims()))
            if dim is PER_SAMPLE:
                out[field] = fields.as_scalar(value, index, field)
            else:
                values = fields.as_per_token_values(value, index, field)
                out[field] = fields.require_entries(values, length, index, field, padded_length)
        return out

    def collate_micro_batch(self, micro_batch: dict) -> tuple[dict, dict]:
        """``(model inputs, loss inputs)`` of one packed micro-batch.

        ``micro_batch`` holds ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` (each
        ``[1, T_r]``: this rank's CP share of the pack), ``packed_seq_params``, ``sample_ids``
        (indices into the global batch, in pack order) and the flow's extra fields.
        """
        raise NotImplementedError(f"flow {type(self).__qualname__} must implement "
                                  f"collate_micro_batch(micro_batch) -> (model inputs, loss "
                                  f"inputs) (docs/WRAP.md section 3), or subclass GPTFlow")

    def loss(self, output: torch.Tensor, loss_inputs: dict):
        """``(loss_sum, num_tokens, metrics)`` of one micro-batch (module docstring)."""
        raise NotImplementedError(f"flow {type(self).__qualname__} must implement "
                                  f"loss(output, loss_inputs) -> (loss_sum, num_tokens, metrics) "
                                  f"(docs/WRAP.md section 3), or subclass GPTFlow")


MEGATRON_WRAP_METHODS = {
    "get_fields_and_seqdims": "fields_and_seq_dims() (sequence dim 0: fields are per sample, "
                              "not [batch, seq])",
    "collate_data_micro_batch": "collate_micro_batch(micro_batch), which gets the packed "
                                "micro-batch instead of an iterator of samples",
    "calculate_loss": "loss(output, loss_inputs) -> (loss_sum, num_tokens, metrics), a sum "
                      "and a count instead of a mean (no CP or DP reduction of your own)",
}
"""megatron-wrap's flow methods, which this facade never calls, and what replaces each."""


def check_flow_class(flow_class: type[Flow]) -> None:
    """A flow written against megatron-wrap's method names, or one that implements neither
    ``collate_micro_batch`` nor ``loss``, is a one-line error here rather than a run that
    silently uses the inherited methods.

    Raises:
        TypeError: Names the class, the methods found and their replacements.
    """
    found = [name for name in MEGATRON_WRAP_METHODS if hasattr(flow_class, name)]
    if found:
        replacements = "; ".join(f"{name} -> {MEGATRON_WRAP_METHODS[name]}" for name in found)
        raise TypeError(f"flow {flow_class.__qualname__} defines megatron-wrap's "
                        f"{', '.join(found)}, which megatron.wrap never calls (it packs the "
                        f"samples itself): rename {replacements} (docs/MIGRATING.md, "
                        f"'From megatron-wrap')")
