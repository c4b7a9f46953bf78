"""A resume continues the saved run exactly (dropout
included), applies a changed schedule only when told which side wins, and refuses a layout
change that would change the model."""

import json

import pytest

from megatron.varlen_training.checkpoint.integrity import MANIFEST_FILENAME, file_digest
from megatron.varlen_training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank

# The last remedy of a dp_reshardable refusal: how to save a checkpoint that follows the change.
FULLY_RESHARDABLE_REMEDY = ("a save with --dist-ckpt-optim-fully-reshardable is resumable at "
                            "another layout")


def _run(argv, world=1):
    return loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                              timeout_s=240))


def _refusal(argv):
    try:
        train_on_this_rank(argv)
    except CheckpointError as err:
        return str(err)
    return None


def _refusals(argv, world=1):
    return run_distributed(_refusal, world, args=(argv,), timeout_s=240)


def _lrs(path):
    return [json.loads(line)["lr"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def four_iters(tmp_path_factory):
    """4 iterations of a 4-iteration schedule (--lr-decay-iters defaults to --train-iters)."""
    root = tmp_path_factory.mktemp("four")
    _run(TINY_GPT_ARGS + ["--train-iters", "4", "--save", str(root)])
    return root


def test_longer_schedule_on_resume_is_refused(four_iters):
    messages = _refusals(TINY_GPT_ARGS + ["--train-iters", "8", "--load", str(four_iters)])
    assert messages == [
        "--load: the checkpoint's schedule has --lr-decay-iters (default --train-iters) 4, "
        "this run has 8; pass --override-opt_param-scheduler to use this run's value or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's"]


def test_other_lr_on_resume_is_refused(four_iters):
    message = _refusals(TINY_GPT_ARGS + ["--train-iters", "4", "--lr", "2e-3", "--load",
                                         str(four_iters)])[0]
    assert message.startswith("--load: the checkpoint's schedule has --lr 0.001, this run "
                              "has 0.002;"), message


def test_override_follows_this_runs_schedule(four_iters, tmp_path):
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    _run(TINY_GPT_ARGS + ["--train-iters", "8", "--log-metrics-jsonl", str(straight)])
    _run(TINY_GPT_ARGS + ["--train-iters", "8", "--load", str(four_iters),
                          "--override-opt_param-scheduler", "--log-metrics-jsonl", str(resumed)])
    assert _lrs(resumed) == _lrs(straight)[4:] and _lrs(resumed)[0] > 0


def test_use_checkpoint_keeps_the_saved_schedule(four_iters, tmp_path):
    resumed = tmp_path / "resumed.jsonl"
    _run(TINY_GPT_ARGS + ["--train-iters", "6", "--load", str(four_iters),
                          "--use-checkpoint-opt_param-scheduler", "--log-metrics-jsonl",
                          str(resumed)])
    assert _lrs(resumed) == [0.0, 0.0]  # the 4-iteration decay had ended


def test_padded_vocab_change_is_refused(tmp_path):
    args = TINY_GPT_ARGS + ["--vocab-size", "130", "--lr-decay-iters", "4"]
    _run(args + ["--train-iters", "2", "--save", str(tmp_path)])
    messages = _refusals(args + ["--train-iters", "3", "--load", str(tmp_path),
                                 "--tensor-model-parallel-size", "2"], world=2)
    assert messages[0] == messages[1] == (
        "--load: the checkpoint's padded vocabulary is 160 (vocab 130 padded to "
        "--make-vocab-size-divisible-by 32 x TP 1), this run's is 192 (vocab 130 padded to "
        "--make-vocab-size-divisible-by 32 x TP 2): that would change the model; choose "
        "--make-vocab-size-divisible-by so that both give the same size")


def test_layout_change_that_keeps_the_model_still_resumes(tmp_path):
    args = TINY_GPT_ARGS + ["--lr-decay-iters", "4"]
    straight = _run(args + ["--train-iters", "3"])
    first = _run(args + ["--train-iters", "2", "--save", str(tmp_path)])
    resumed = _run(args + ["--train-iters", "3", "--load", str(tmp_path),
                           "--tensor-model-parallel-size", "2"], world=2)
    assert [h["lm_loss"] for h in first] == [h["lm_loss"] for h in straight[:2]]
    assert resumed[0]["lm_loss"] == pytest.approx(straight[2]["lm_loss"], rel=1e-5)


def _without(argv, flags):
    """``argv`` without ``flags`` and their values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


def test_resume_with_dropout_is_bit_exact(tmp_path):
    """Default dropout (0.1) on TP2: each TP rank's tracked RNG stream must be restored."""
    args = _without(TINY_GPT_ARGS, {"--hidden-dropout", "--attention-dropout"})
    args += ["--lr-decay-iters", "8", "--tensor-model-parallel-size", "2"]
    straight = _run(args + ["--train-iters", "8"], world=2)
    first = _run(args + ["--train-iters", "4", "--save", str(tmp_path)], world=2)
    resumed = _run(args + ["--train-iters", "8", "--load", str(tmp_path)], world=2)
    got = [h["lm_loss"] for h in first + resumed]
    want = [h["lm_loss"] for h in straight]
    assert got == want, f"resumed {got} != straight {want}"


# --- optimizer-state layout changes are refused in one line -------


@pytest.mark.parametrize("saved_with, resumed_with, remedy", [
    ([], ["--use-distributed-optimizer"], "remove"),
    (["--use-distributed-optimizer"], [], "add"),
])
def test_distributed_optimizer_toggle_is_refused(tmp_path, saved_with, resumed_with, remedy):
    args = TINY_GPT_ARGS + ["--lr-decay-iters", "4"]
    _run(args + saved_with + ["--train-iters", "2", "--save", str(tmp_path)])
    message = _refusals(args + resumed_with + ["--train-iters", "3", "--load", str(tmp_path)])[0]
    with_, without = ("with --use-distributed-optimizer (state sharded over data-parallel ranks)",
                      "without --use-distributed-optimizer (state per parameter)")
    saved, mine = (with_, without) if saved_with else (without, with_)
    assert message == (f"--load: the checkpoint's optimizer state was saved {saved}, this run is "
                       f"{mine}: the two layouts are not converted; {remedy} "
                       f"--use-distributed-optimizer to resume")


def _losses_or_refusals(runs: list[list[str]]) -> list:
    """Each run in turn on this rank: its lm losses, or its load's one-line refusal."""
    out = []
    for argv in runs:
        try:
            out.append([step["lm_loss"] for step in train_on_this_rank(argv)["history"]])
        except CheckpointError as err:
            out.append(str(err))
    return out


def test_model_parallel_change_with_distributed_optimizer_is_one_line(tmp_path):
    """--use-distributed-optimizer's state (dp_reshardable) reshards over data-parallel ranks
    only; a TP or PP change ended in a KeyError traceback per rank from megatron-core. Refused
    in one line; --no-load-optim loads the weights alone (the first resumed loss, before any
    update, is the straight run's). One 2-rank launch."""
    args = TINY_GPT_ARGS + ["--lr-decay-iters", "4", "--use-distributed-optimizer"]
    load = ["--train-iters", "3", "--load", str(tmp_path)]
    runs = [args + ["--train-iters", "2", "--save", str(tmp_path)], args + ["--train-iters", "3"],
            args + load + ["--tensor-model-parallel-size", "2"],
            args + load + ["--pipeline-model-parallel-size", "2"],
            args + load + ["--tensor-model-parallel-size", "2", "--no-load-optim"]]
    rank0 = run_distributed(_losses_or_refusals, 2, args=(runs,), timeout_s=240)[0]
    saved, straight, tp2, pp2, weights_only = rank0
    assert len(saved) == 2 and len(straight) == 3
    for refusal, flag in ((tp2, "--tensor-model-parallel-size"),
                          (pp2, "--pipeline-model-parallel-size")):
        assert refusal == (
            f"--load: the checkpoint's distributed optimizer state was saved with {flag} 1, "
            f"this run has 2: its format (megatron-core's dp_reshardable) reshards over "
            f"data-parallel ranks only (resume with {flag} 1, or add --no-load-optim to load "
            f"the weights only; {FULLY_RESHARDABLE_REMEDY})")
    assert weights_only[0] == pytest.approx(straight[2], rel=1e-5)


def test_virtual_pipeline_change_with_distributed_optimizer_is_one_line(tmp_path):
    """Virtual pipeline stages change the distributed optimizer's buffers too: megatron-core
    stopped every rank with a global-shape CheckpointingException traceback. Refused in one line,
    both ways (saved with VPP, resumed without; and the reverse). The same virtual stages spelled
    with --num-virtual-stages-per-pipeline-rank resume, optimizer state and all, as the straight
    run (iteration 3's loss follows the Adam moments loaded). One 2-rank launch."""
    args = ["--num-layers", "4"] + TINY_GPT_ARGS[2:] + [
        "--lr-decay-iters", "4", "--use-distributed-optimizer", "--pipeline-model-parallel-size",
        "2"]
    vpp = ["--num-layers-per-virtual-pipeline-stage", "1"]
    with_vpp, without_vpp = tmp_path / "with_vpp", tmp_path / "without_vpp"
    runs = [args + vpp + ["--train-iters", "1", "--save", str(with_vpp)],
            args + ["--train-iters", "1", "--save", str(without_vpp)],
            args + ["--train-iters", "2", "--load", str(with_vpp)],
            args + vpp + ["--train-iters", "2", "--load", str(without_vpp)],
            args + vpp + ["--train-iters", "3"],
            args + ["--num-virtual-stages-per-pipeline-rank", "2", "--train-iters", "3",
                    "--load", str(with_vpp)]]
    flag = "--num-layers-per-virtual-pipeline-stage"
    per_rank = run_distributed(_losses_or_refusals, 2, args=(runs,), timeout_s=240)
    rank0, straight, respelled = per_rank[0], per_rank[-1][4], per_rank[-1][5]  # last: the loss
    assert isinstance(respelled, list), respelled
    assert respelled == pytest.approx(straight[1:], rel=1e-5)
    assert rank0[2] == (
        f"--load: the checkpoint's distributed optimizer state was saved with {flag} 1, this "
        f"run has none: its format (megatron-core's dp_reshardable) reshards over data-parallel "
        f"ranks only (resume with {flag} 1, or add --no-load-optim to load the weights only; "
        f"{FULLY_RESHARDABLE_REMEDY})")
    assert rank0[3] == (
        f"--load: the checkpoint's distributed optimizer state was saved without {flag}, this "
        f"run has 1: its format (megatron-core's dp_reshardable) reshards over data-parallel "
        f"ranks only (resume without {flag}, or add --no-load-optim to load the weights only; "
        f"{FULLY_RESHARDABLE_REMEDY})")


# --- data identity is content, not spelling -----------------------

SFT_SAMPLES = 24


def _sft_args(data_path, *extra):
    args = [a for a in TINY_GPT_ARGS if a != "--mock-data"]
    at = args.index("--tokenizer-type")
    del args[at:at + 4]  # --tokenizer-type NullTokenizer --vocab-size 128
    return args + ["--sft", "--data-path", str(data_path), "--tokenizer-type",
                   "ByteLevelTokenizer", "--lr-decay-iters", "4", *extra]


@pytest.fixture
def sft_data(tmp_path, monkeypatch):
    """A JSONL data file and a checkpoint trained on it (2 iterations), the working directory
    being the data's folder so that relative spellings resolve to it."""
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"question {i}", "response": f"answer {i}"})
                            + "\n" for i in range(SFT_SAMPLES)))
    monkeypatch.chdir(data.parent)
    root = tmp_path / "ckpt"
    _run(_sft_args(data, "--train-iters", "2", "--save", str(root)))
    return data, root


@pytest.mark.parametrize("spelling", ["train.jsonl", "./train.jsonl", "../data/./train.jsonl",
                                      "link.jsonl"])
def test_respelled_data_path_resumes(sft_data, spelling):
    data, root = sft_data
    (data.parent / "link.jsonl").symlink_to(data)
    resumed = _run(_sft_args(spelling, "--train-iters", "3", "--load", str(root)))
    assert len(resumed) == 1


def test_changed_data_file_is_refused_unless_overridden(sft_data):
    data, root = sft_data
    data.write_text(data.read_text().replace("answer 3", "answer 4"))  # same size, other bytes
    message = _refusals(_sft_args("./train.jsonl", "--train-iters", "3", "--load", str(root)))[0]
    assert message.startswith(f"--load: --data-path entry 1 is './train.jsonl' ({data}: "), \
        message
    assert (f"the checkpoint was trained on '{data}' ({data}: {data.stat().st_size} bytes, "
            "sha256 ") in message, message
    assert message.endswith("other data would change the samples the resumed run reads; "
                            "restore the checkpoint's data, or pass --override-data-fingerprint "
                            "to train on this data deliberately"), message
    resumed = _run(_sft_args(data, "--train-iters", "3", "--load", str(root),
                             "--override-data-fingerprint"))
    assert len(resumed) == 1


def _rewrite_run_args(path, recorded: dict) -> None:
    """Writes ``recorded`` as the checkpoint's run_args.json, its manifest entry to match (an
    older checkpoint's manifest covered its own file)."""
    path.write_text(json.dumps(recorded))
    manifest_path = path.parent / MANIFEST_FILENAME
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][path.name] = file_digest(str(path))
    manifest_path.write_text(json.dumps(manifest))


def test_sft_checkpoint_from_before_split_was_honoured(sft_data):
    """A checkpoint saved while --sft ignored --split (the last 5% validated whatever it said,
    so its run_args.json records a --split but no split rule) trained on another set than this
    run's --split gives: refused in one line; without --split (the tail rule) it resumes."""
    data, root = sft_data
    for run_args in root.glob("iter_*/run_args.json"):  # as such a checkpoint recorded it
        recorded = json.loads(run_args.read_text())
        del recorded["sft_split_rule"]
        _rewrite_run_args(run_args, {**recorded, "split": "80,20,0"})
    message = _refusals(_sft_args(data, "--train-iters", "3", "--load", str(root),
                                  "--split", "80,20,0"))[0]
    assert message == ("--load: the checkpoint's SFT run held out the last 5% of its file for "
                       "validation and trained on the rest (before --sft honoured --split, its "
                       "--split 80,20,0 was not applied), this run splits the file by --split "
                       "80,20,0: another training set; resume without --split to keep the "
                       "checkpoint's samples"), message
    for run_args in root.glob("iter_*/run_args.json"):
        _rewrite_run_args(run_args, {**json.loads(run_args.read_text()), "split": None})
    assert len(_run(_sft_args(data, "--train-iters", "3", "--load", str(root)))) == 1


# --- the refusal names the flag the user changed ------------------


def _with_value(argv, flag, value):
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_seq_length_change_names_seq_length(four_iters):
    argv = _with_value(TINY_GPT_ARGS, "--seq-length", "64")
    message = _refusals(argv + ["--train-iters", "4", "--load", str(four_iters)])[0]
    assert message == ("--load: the checkpoint was trained with --seq-length 32, this run has "
                       "64: that would change the model (its position table has --seq-length "
                       "entries); use the checkpoint's value")


def test_max_position_embeddings_change_still_names_it(four_iters):
    message = _refusals(TINY_GPT_ARGS + ["--train-iters", "4", "--load", str(four_iters),
                                         "--max-position-embeddings", "64"])[0]
    assert message == ("--load: the checkpoint was trained with --max-position-embeddings 32, "
                       "this run has 64: that would change the model; use the checkpoint's "
                       "value")
