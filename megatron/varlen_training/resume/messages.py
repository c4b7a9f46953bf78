"""The one-line refusals of a model-shape or data-order key that differs on resume.

Each names the flag to change and both values; where the recorded key is not what the user
set (the padded vocabulary, the position table that follows ``--seq-length``, the sample
count indexed data was built for, the SFT split rule), the message names the flag that is.
"""

from __future__ import annotations

from megatron.varlen_training.resume.run_args_keys import (
    DOCUMENT_PIECE_KEY, FLAG_OF_KEY, INDEXED_SAMPLES_KEY, MODEL_KEYS, SFT_KEYS,
    SFT_SPLIT_RULE_KEY, SFT_SPLIT_TAIL,
)


def _flag(key: str) -> str:
    return FLAG_OF_KEY.get(key, "--" + key.replace("_", "-"))


def recorded_key_mismatch(key: str, saved: dict, mine: dict) -> str:
    """The refusal of a resume whose ``key`` (a model-shape or data-order key) differs from the
    checkpoint's record ``saved``: the flag to change and both values."""
    if key == "padded_vocab_size":
        def why(side):
            return (f"{side['padded_vocab_size']} (vocab {side['vocab_size']} padded to "
                    f"--make-vocab-size-divisible-by {side['make_vocab_size_divisible_by']} x TP "
                    f"{side['tensor_model_parallel_size']})")
        return (f"--load: the checkpoint's padded vocabulary is {why(saved)}, this run's is "
                f"{why(mine)}: that would change the model; choose "
                f"--make-vocab-size-divisible-by so that both give the same size")
    if key == "max_position_embeddings" and _follows_seq_length(saved) \
            and _follows_seq_length(mine):
        # Neither run set --max-position-embeddings (or both set it to --seq-length): the user
        # changed --seq-length, so that is the flag to name (test_resume_consistency.py).
        return (f"--load: the checkpoint was trained with --seq-length {saved['seq_length']}, "
                f"this run has {mine['seq_length']}: that would change the model (its position "
                f"table has --seq-length entries); use the checkpoint's value")
    if key == INDEXED_SAMPLES_KEY:
        return _indexed_samples_mismatch(saved.get(key), mine[key])
    if key == DOCUMENT_PIECE_KEY and None not in (saved.get(key), mine[key]):
        return (f"--load: the checkpoint's --packing-unit document run cut documents into "
                f"pieces of at most {saved[key]} tokens, this run cuts at {mine[key]} "
                f"(--document-piece-length, else the longest sequence the layout runs: "
                f"--max-seqlen-per-dp-cp-rank x its largest CP group): other pieces, so another "
                f"document order; pass --document-piece-length {saved[key]} (on a layout whose "
                f"longest sequence is at least that), or --override-data-fingerprint to "
                f"continue from the saved position with this run's pieces")
    if key == SFT_SPLIT_RULE_KEY and saved.get(key) == SFT_SPLIT_TAIL:
        return (f"--load: the checkpoint's SFT run held out the last 5% of its file for "
                f"validation and trained on the rest (before --sft honoured --split, its "
                f"--split {saved.get('split')} was not applied), this run splits the file by "
                f"--split {mine['split']}: another training set; resume without --split to "
                f"keep the checkpoint's samples")
    what = "the model" if key in MODEL_KEYS else "the fields read from the SFT records" \
        if key in SFT_KEYS else "the data order"
    return (f"--load: the checkpoint was trained with {_flag(key)} {saved.get(key)}, this run "
            f"has {mine[key]}: that would change {what}; use the checkpoint's value")


def _indexed_samples_mismatch(saved: int | None, mine: int | None) -> str:
    if saved is None or mine is None:
        what = "mock or SFT data" if saved is None else "indexed data"
        return (f"--load: the checkpoint was trained on {what}, this run reads "
                f"{'indexed data' if saved is None else 'mock or SFT data'}: another sample "
                f"stream; use the checkpoint's data flags")
    return (f"--load: the checkpoint's indexed data was built for {saved} training samples "
            f"(--train-iters x --global-batch-size), this run's for {mine}: megatron-core "
            f"shuffles over as many epochs as that needs, so the resumed run would read "
            f"another sample order; keep the checkpoint's --train-iters (or pass "
            f"--override-data-fingerprint to resume on that other order deliberately)")


def _follows_seq_length(side: dict) -> bool:
    """Whether the position table of this side is --seq-length long (the default)."""
    return side.get("seq_length") is not None and \
        side.get("max_position_embeddings") == side["seq_length"]
