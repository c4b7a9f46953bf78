"""``--sft-messages-key`` / ``--sft-prompt-key`` / ``--sft-response-key`` in the facade: the
``gpt_sft`` flow reads text samples under the run's keys, as the SFT dataset does, and a resume
with other keys is refused in one line.

- flow level: records with renamed keys give exactly the samples of the default-named records
  and of the JSONL dataset reading the renamed file with the same flags;
- facade level (one gloo rank): a run whose config names the keys trains on the renamed records
  with the losses of the default-named run;
- resume: another key than the checkpoint's is a one-line CheckpointError naming the flag.
"""

import json

import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.sft import SFTDataset, sft_keys
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_record import save_run_args
from megatron.varlen_training.tokenizer import build_tokenizer
from megatron.wrap import FlowContext, GPTSFTFlow, MegatronWrap
from megatron.wrap.batch import length_limit
from tests.harness.multirank import run_distributed

KEYS = {"sft_messages_key": "conversation", "sft_prompt_key": "question",
        "sft_response_key": "answer"}
DEFAULT_NAMED = [
    {"prompt": "2+2?", "response": "4."},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello there!"}]},
    {"prompt": "Name a colour.", "response": "Teal"},
    {"messages": [{"role": "user", "content": "Count to 3"},
                  {"role": "assistant", "content": "1 2 3"}]},
]
RENAMES = {"prompt": "question", "response": "answer", "messages": "conversation"}
RENAMED = [{RENAMES[key]: value for key, value in record.items()} for record in DEFAULT_NAMED]
ARGV = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "64", "--lr", "1e-3", "--train-iters", "2", "--global-batch-size", "4",
        "--mock-data", "--sft", "--tokenizer-type", "ByteLevelTokenizer", "--seed", "3"]


def _flags(keys: dict) -> list[str]:
    return [part for key, value in keys.items()
            for part in ("--" + key.replace("_", "-"), value)]


def _context(keys: dict) -> FlowContext:
    run = parse_run_config(ARGV + _flags(keys), world_size=1)
    tokenizer = build_tokenizer(run.data.tokenizer_type, run.model.vocab_size)
    run = run.with_vocabulary(tokenizer.vocab_size)
    return FlowContext(run, tokenizer, *length_limit(run))


def test_renamed_keys_give_the_default_named_samples(tmp_path):
    renamed = GPTSFTFlow(_context(KEYS)).build_samples(RENAMED)
    default = GPTSFTFlow(_context({})).build_samples(DEFAULT_NAMED)
    path = tmp_path / "renamed.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in RENAMED))
    context = _context(KEYS)
    dataset = SFTDataset(str(path), context.tokenizer, context.run.model.seq_length,
                         keys=sft_keys(context.run.data))
    for index, (got, want) in enumerate(zip(renamed, default)):
        from_file = dataset[index]
        for key in ("tokens", "labels", "loss_mask"):
            assert torch.equal(got[key], want[key]), (index, key)
            assert torch.equal(got[key], from_file[key][: from_file["length"]]), (index, key)


def test_renamed_keys_are_named_when_a_sample_has_none():
    with pytest.raises(ValueError, match="question\\+answer or conversation$"):
        GPTSFTFlow(_context(KEYS)).build_samples([{"prompt": "hi", "response": "there"}])


def rank_train(keys: dict, batch: list[dict]) -> list[float]:
    config = {
        "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                  "seq_length": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_iters": 2,
                     "lr": 1e-3, "seed": 3, "eval_iters": 0},
        "data": {"tokenizer_type": "ByteLevelTokenizer", **keys},
        "logging": {"metric_writers": [], "progress_bar": False},
    }
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        return [wrap.train(batch)["loss"] for _ in range(2)]


def test_renamed_keys_train_like_the_default_named_records():
    renamed = run_distributed(rank_train, 1, args=(KEYS, RENAMED), timeout_s=180)[0]
    default = run_distributed(rank_train, 1, args=({}, DEFAULT_NAMED), timeout_s=180)[0]
    assert renamed == default and renamed[0] != renamed[1]


@pytest.mark.parametrize("key", sorted(KEYS))
def test_resume_with_another_key_is_refused_in_one_line(tmp_path, key):
    saved = parse_run_config(ARGV + _flags(KEYS), world_size=1)
    save_run_args(str(tmp_path), saved, iteration=1)
    assert check_run_args(str(tmp_path), saved) is None
    other = parse_run_config(ARGV + _flags({**KEYS, key: "other"}), world_size=1)
    with pytest.raises(CheckpointError) as err:
        check_run_args(str(tmp_path), other)
    flag = "--" + key.replace("_", "-")
    assert str(err.value) == (
        f"--load: the checkpoint was trained with {flag} {KEYS[key]}, this run has other: that "
        f"would change the fields read from the SFT records; use the checkpoint's value")
