"""The document flags' start-up checks: one line naming the flag and the way out."""

from __future__ import annotations

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.hybrid_arguments import parse_hybrid_args
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "1"]


def _refusal(argv, parse=parse_args) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        parse(argv, world_size=1)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_megatron_flags_parse_on_both_paths():
    run = parse_args(BASE + ["--reset-position-ids", "--reset-attention-mask",
                             "--eod-mask-loss"], world_size=1)
    assert (run.reset_position_ids, run.reset_attention_mask, run.eod_mask_loss) == \
        (True, True, True)
    packed = parse_args(BASE + ["--micro-batch-size", "1", "--sequence-packing",
                                "--eod-mask-loss"], world_size=1)
    assert packed.packing_unit == "sample"


def test_dense_mask_needs_the_local_backend():
    # --bf16: FlashAttention on CUDA also needs half precision (refused first in fp32).
    flash = ["--attention-backend", "flash", "--bf16"]
    message = _refusal(BASE + ["--reset-attention-mask", *flash])
    assert message.startswith("--reset-attention-mask without --sequence-packing")
    assert "--attention-backend local" in message
    parse_args(BASE + ["--micro-batch-size", "1", "--sequence-packing", "--reset-position-ids",
                       "--reset-attention-mask", *flash], world_size=1)


PACKED = BASE + ["--micro-batch-size", "1", "--sequence-packing"]


def test_packed_learned_positions_need_both_flags_or_neither():
    message = _refusal(PACKED + ["--reset-attention-mask"])
    assert message.startswith("--reset-attention-mask with --sequence-packing packs every "
                              "document as its own sequence") and "--reset-position-ids" in message
    message = _refusal(PACKED + ["--reset-position-ids"])
    assert message.startswith("--reset-position-ids with --sequence-packing but without "
                              "--reset-attention-mask")
    # RoPE reads no position ids: either flag alone is the unpacked run's semantics already.
    for flag in ("--reset-attention-mask", "--reset-position-ids"):
        parse_args(PACKED + [flag, "--position-embedding-type", "rope"], world_size=1)


def test_reset_flags_are_for_pretraining_data():
    message = _refusal(BASE + ["--sft", "--eod-mask-loss"])
    assert message.startswith("--eod-mask-loss applies to pretraining data, not --sft")


@pytest.mark.parametrize("extra", [[], ["--sequence-packing", "--micro-batch-size", "1"]])
def test_document_unit_needs_packed_indexed_data(extra):
    message = _refusal(BASE + extra + ["--packing-unit", "document"])
    assert message.startswith("--packing-unit document packs whole documents")


def test_unpacked_reset_mask_is_refused_for_mamba_layers():
    argv = ["--num-layers", "2", "--hybrid-override-pattern", "M*", "--hidden-size", "32",
            "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
            "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "64",
            "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--mamba-state-dim", "16",
            "--reset-position-ids", "--reset-attention-mask", "--attention-backend", "local"]
    assert "Mamba layers would still carry state" in _refusal(argv, parse_hybrid_args)
    parse_hybrid_args(argv + ["--sequence-packing"], world_size=1)  # packed: accepted


def test_facade_refuses_the_document_keys():
    """MegatronWrap's samples are the caller's: the document keys would be ignored."""
    from megatron.wrap.config.build import build_config
    from megatron.wrap.config.errors import ConfigError
    from megatron.wrap.runtime import refuse_document_keys

    for key, value in (("eod_mask_loss", True), ("packing_unit", "document"),
                       ("document_piece_length", 64)):
        config = build_config({"data": {key: value}})
        with pytest.raises(ConfigError, match=rf"^config key '{key}' \({value!r}\) acts on "):
            refuse_document_keys(dict(config.flat))
    refuse_document_keys(dict(build_config({"data": {"reset_position_ids": False}}).flat))
