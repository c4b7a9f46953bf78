"""``--use-checkpoint-args`` (checkpoint_model_flags.py): the model flags of the checkpoint being
loaded, as Megatron-LM's ``load_args_from_checkpoint`` takes them.

Parsing (fast, no training): a checkpoint folder holding only the ``run_args.json`` that
resume/run_args_record.py writes for a run with a non-default architecture (the record is built
from the run the flags describe, not by the code under test):

- the run parsed with ``--use-checkpoint-args`` and no model flags has the same model config,
  field for field, as the run parsed with the flags (pretrain_gpt.py, pretrain_mamba.py's
  hybrid shape, and megatron.wrap's config values);
- which side wins, as in Megatron-LM: a size given on the command line stays (``Keeping``),
  another model flag is replaced by the checkpoint's with a line naming the flag it overrides;
- the checkpoint read is the one loaded: ``--ckpt-step``'s iteration, and
  ``--pretrained-checkpoint`` while ``--load`` holds nothing;
- refusals are one line (exit code 2 from an entry point): nothing to load, a ``--load``
  holding no checkpoint (or not ``--ckpt-step``'s iteration), no or a garbled
  ``run_args.json``, a required key the checkpoint does not record
  (named; given on the command line, the run parses). A restartable job's first launch
  (``--save`` == ``--load``, empty) uses the flags given, as Megatron-LM does.

Training (one 1-rank launch): a run saved with a non-default architecture, resumed with
``--use-checkpoint-args`` and no model flags from iteration 2 (``--ckpt-step``), continues with
the straight run's losses; with a conflicting ``--position-embedding-type`` too (the checkpoint
wins); a conflicting ``--num-layers`` (the command line wins) is refused at load in one line.

Export: ``tools/export_hf.py --use-checkpoint-args`` writes the same files, byte for byte, as
with the model flags given.
"""

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import build_parser, parse_args_or_exit
from megatron.varlen_training.checkpoint_model_flags import (
    apply_as_defaults, override_command_line, read_checkpoint_flags,
)
from megatron.varlen_training.config.from_flags import (
    parse_hybrid_run_config, parse_run_config, run_config,
)
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.flag_values import parse_values
from megatron.varlen_training.load_options import TRACKER_FILENAME, iteration_folder
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
from megatron.varlen_training.resume.run_args_record import snapshot
from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank

REPO = Path(__file__).resolve().parents[3]
LAUNCH_TIMEOUT_S = 240
EXPORT_TIMEOUT_S = 240
# A Llama-like model (exportable) with every architecture flag away from its default.
ARCHITECTURE = [
    "--num-layers", "3", "--hidden-size", "48", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--ffn-hidden-size", "96",
    "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--rotary-base", "5000",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--seq-length", "32",
    "--vocab-size", "96", "--make-vocab-size-divisible-by", "32", "--norm-epsilon", "1e-6",
]
TRAINING = [
    "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--mock-data",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "7", "--train-iters", "4", "--lr-decay-iters", "4",
]
USE = ["--use-checkpoint-args"]


def _record(root: Path, iteration: int, argv: list[str], tracked: bool = True,
            parse=parse_run_config) -> Path:
    """A checkpoint root whose iteration folder holds the run_args.json of ``argv``'s run."""
    folder = Path(iteration_folder(str(root), iteration))
    folder.mkdir(parents=True)
    recorded = snapshot(parse(argv, world_size=1), with_data=False)
    (folder / RUN_ARGS_FILENAME).write_text(json.dumps(recorded))
    if tracked:
        (root / TRACKER_FILENAME).write_text(str(iteration))
    return root


def _model_differences(first, second) -> dict:
    return {field.name: (getattr(first.model, field.name), getattr(second.model, field.name))
            for field in fields(first.model)
            if getattr(first.model, field.name) != getattr(second.model, field.name)}


@pytest.fixture
def recorded(tmp_path) -> Path:
    return _record(tmp_path / "ckpt", 2, ARCHITECTURE + TRAINING)


def test_model_comes_from_the_checkpoint(recorded):
    given = parse_run_config(ARCHITECTURE + TRAINING, world_size=1)
    taken = parse_run_config(TRAINING + USE + ["--load", str(recorded)], world_size=1)
    assert _model_differences(given, taken) == {}


def test_pretrain_mamba_takes_the_hybrid_shape(tmp_path):
    hybrid = ["--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4",
              "--seq-length", "32", "--hybrid-override-pattern", "M*-", "--mamba-state-dim",
              "16", "--mamba-head-dim", "8", "--mamba-num-groups", "2", "--vocab-size", "96",
              "--make-vocab-size-divisible-by", "32"]
    root = _record(tmp_path / "hybrid", 2, hybrid + TRAINING, parse=parse_hybrid_run_config)
    given = parse_hybrid_run_config(hybrid + TRAINING, world_size=1)
    taken = parse_hybrid_run_config(TRAINING + USE + ["--load", str(root)], world_size=1)
    assert _model_differences(given, taken) == {}


def test_facade_config_values_take_it_too(recorded):
    """megatron.wrap's config path (flag_values.parse_values): the same model."""
    values = {"micro_batch_size": 2, "global_batch_size": 4, "lr": 1e-3, "mock_data": True,
              "train_iters": 4, "load": str(recorded), "use_checkpoint_args": True,
              "hidden_dropout": 0.0, "attention_dropout": 0.0}
    given = parse_run_config(ARCHITECTURE + TRAINING, world_size=1)
    assert _model_differences(given, run_config(parse_values(values, world_size=1))) == {}


def test_which_side_wins(recorded, capsys):
    """Megatron-LM: sizes are defaults (the command line's stays), the rest is forced."""
    run = parse_run_config(TRAINING + USE + ["--load", str(recorded), "--num-layers", "5",
                                             "--normalization", "LayerNorm"], world_size=1)
    assert run.model.num_layers == 5 and run.model.normalization == "RMSNorm"
    out = capsys.readouterr().out
    assert "Setting normalization to RMSNorm from checkpoint (overrides --normalization " \
        "LayerNorm on the command line)" in out, out
    assert "Keeping --num-layers 5 from the command line (the checkpoint has 3)" in out, out
    assert "Setting hidden_size to 48 from checkpoint" in out, out


def test_ckpt_step_chooses_the_record(recorded):
    wider = [("64" if previous == "--hidden-size" else value)
             for previous, value in zip([None] + ARCHITECTURE, ARCHITECTURE)]
    _record(recorded, 1, wider + TRAINING, tracked=False)
    latest = parse_run_config(TRAINING + USE + ["--load", str(recorded)], world_size=1)
    first = parse_run_config(TRAINING + USE + ["--load", str(recorded), "--ckpt-step", "1"],
                             world_size=1)
    assert (latest.model.hidden_size, first.model.hidden_size) == (48, 64)


def test_pretrained_checkpoint_while_load_holds_nothing(recorded, tmp_path):
    job = tmp_path / "job"
    run = parse_run_config(TRAINING + USE + ["--load", str(job), "--save", str(job),
                                             "--pretrained-checkpoint", str(recorded)],
                           world_size=1)
    assert run.model.hidden_size == 48 and run.model.swiglu


def test_restartable_first_launch_uses_the_flags_given(tmp_path, capsys):
    job = str(tmp_path / "job")
    run = parse_run_config(ARCHITECTURE + TRAINING + USE + ["--load", job, "--save", job],
                           world_size=1)
    assert run.model.hidden_size == 48
    assert "Checkpoint not found to provide arguments, using provided arguments." in \
        capsys.readouterr().out


def _without(root: Path, key: str | None) -> Path:
    """``root``'s record without ``key`` (None: without run_args.json at all)."""
    path = Path(iteration_folder(str(root), 2)) / RUN_ARGS_FILENAME
    if key is None:
        path.unlink()
    else:
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if k != key}))
    return root


@pytest.mark.parametrize("case, words", [
    ("no_load", "--use-checkpoint-args takes the model flags from the checkpoint being loaded, "
                "but there is nothing to load (pass --load or --pretrained-checkpoint)"),
    ("empty_load", "holds no checkpoint to take the model flags from"),
    ("step_not_saved", "holds no checkpoint iteration 3 to take the model flags from"),
    ("no_run_args", "has no run_args.json to take the model flags from"),
    ("garbled", "run_args.json' is unreadable (JSONDecodeError"),
    ("garbled_tracker", "is garbled (got '2x'); it should hold the latest iteration number; "
                        "pass --ckpt-step N to choose the iteration to read"),
    ("old_record", "run_args.json does not record seq_length (saved before it did): pass "
                   "--seq-length on the command line"),
])
def test_refusals_are_one_line(recorded, tmp_path, case, words):
    if case == "no_load":
        load = []
    elif case == "empty_load":
        load = ["--load", str(tmp_path)]
    elif case == "step_not_saved":
        load = ["--load", str(recorded), "--ckpt-step", "3"]
    elif case == "garbled":
        (Path(iteration_folder(str(recorded), 2)) / RUN_ARGS_FILENAME).write_text("{not json")
        load = ["--load", str(recorded)]
    elif case == "garbled_tracker":
        (recorded / TRACKER_FILENAME).write_text("2x")
        load = ["--load", str(recorded)]
    else:
        load = ["--load", str(_without(recorded, "seq_length" if case == "old_record" else None))]
    with pytest.raises(ArgumentValidationError) as caught:
        parse_run_config(TRAINING + USE + load, world_size=1)
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_missing_key_given_on_the_command_line(recorded):
    run = parse_run_config(TRAINING + USE + ["--load", str(_without(recorded, "seq_length")),
                                             "--seq-length", "32"], world_size=1)
    assert run.model.seq_length == 32 and run.model.hidden_size == 48


# What Megatron-LM's load_args_from_checkpoint takes beyond the model shape, away from the
# defaults: the dropouts, query-key layer scaling, a TikTokenizer (its file, its --vocab-size,
# its pattern) and, for MoE, the router's flags.
BEYOND_SHAPE = ["--hidden-dropout", "0.05", "--attention-dropout", "0.2",
                "--apply-query-key-layer-scaling"]
TIKTOKEN = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "/elsewhere/tok.json",
            "--vocab-size", "1200", "--tiktoken-pattern", "v1"]
MOE_ROUTER = ["--disable-bias-linear", "--num-experts", "4", "--moe-ffn-hidden-size", "16",
              "--moe-router-topk", "2",
              "--moe-router-pre-softmax", "--moe-router-score-function", "sigmoid",
              "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor", "2.0"]
SHAPE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "32", "--make-vocab-size-divisible-by", "32"]
_DROPOUTS = ("--hidden-dropout", "--attention-dropout")
# The run flags with the dropouts left out (each flag's value follows it).
MINIMAL = [value for index, value in enumerate(TRAINING)
           if value not in _DROPOUTS and (index == 0 or TRAINING[index - 1] not in _DROPOUTS)]


@pytest.mark.parametrize("extra", [TIKTOKEN, MOE_ROUTER + ["--vocab-size", "96"]],
                         ids=["tiktoken", "moe_router"])
def test_minimal_resume_flags_record_the_original_run_args(tmp_path, extra):
    """A resume given only the run flags and --use-checkpoint-args records the run_args.json
    the original run did (the record is what describes a run)."""
    original = SHAPE + BEYOND_SHAPE + extra + MINIMAL
    root = _record(tmp_path / "ckpt", 2, original)
    resumed = parse_run_config(MINIMAL + USE + ["--load", str(root)], world_size=1)
    want = snapshot(parse_run_config(original, world_size=1), with_data=False)
    assert snapshot(resumed, with_data=False) == want
    # Not vacuous: the minimal command line alone describes another run.
    alone = snapshot(parse_run_config(MINIMAL + SHAPE + ["--vocab-size", "96"], world_size=1),
                     with_data=False)
    assert {key for key in want if alone[key] != want[key]} >= {
        "hidden_dropout", "attention_dropout", "apply_query_key_layer_scaling"}


def test_no_use_tokenizer_model_keeps_the_command_lines_tokenizer(tmp_path, capsys):
    """Megatron-LM's --no-use-tokenizer-model-from-checkpoint-args: the tokenizer type and
    file stay the command line's (the checkpoint's file may lie elsewhere); the rest is taken."""
    root = _record(tmp_path / "ckpt", 2, SHAPE + BEYOND_SHAPE + TIKTOKEN + MINIMAL)
    here = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "/here/tok.json",
            "--vocab-size", "1200"]
    for flag in ("--no-use-tokenizer-model-from-checkpoint-args",
                 "--disable-use-tokenizer-model-from-checkpoint-args"):
        run = parse_run_config(MINIMAL + USE + here + [flag, "--load", str(root)],
                               world_size=1)
        assert run.data.tokenizer_model == "/here/tok.json"
        assert run.data.tiktoken_pattern == "v1" and run.model.hidden_dropout == 0.05
    taken = parse_run_config(MINIMAL + USE + here + ["--load", str(root)], world_size=1)
    assert taken.data.tokenizer_model == "/elsewhere/tok.json"
    assert "Setting tokenizer_model to /elsewhere/tok.json from checkpoint (overrides " \
        "--tokenizer-model /here/tok.json on the command line)" in capsys.readouterr().out


# Megatron-LM's load_args_from_checkpoint also takes --spec (forced) and
# --moe-token-dispatcher-type (a default only); --tiktoken-num-special-tokens goes with
# --tiktoken-pattern (forced). Each away from its default, and its value written by hand.
SPEC = ["megatron.varlen.model.spec", "get_varlen_gpt_layer_spec"]
TIKTOKEN_SPECIALS = TIKTOKEN + ["--tiktoken-num-special-tokens", "500"]
ALLTOALL = MOE_ROUTER + ["--vocab-size", "96", "--moe-token-dispatcher-type", "alltoall"]


@pytest.mark.parametrize("extra, key, value", [
    (TIKTOKEN_SPECIALS, "tiktoken_num_special_tokens", 500),
    (["--vocab-size", "96", "--spec", *SPEC], "spec", SPEC),
    (ALLTOALL, "moe_token_dispatcher_type", "alltoall"),
], ids=["tiktoken_num_special_tokens", "spec", "moe_token_dispatcher_type"])
def test_keys_beyond_the_shape_are_recorded_and_taken(tmp_path, extra, key, value):
    """Saved in run_args.json as given; a resume with --use-checkpoint-args and only the run
    flags builds the original run (its record is the original's)."""
    original = SHAPE + extra + MINIMAL
    root = _record(tmp_path / "ckpt", 2, original)
    recorded = json.loads((Path(iteration_folder(str(root), 2)) / RUN_ARGS_FILENAME).read_text())
    assert recorded[key] == value
    resumed = parse_run_config(MINIMAL + USE + ["--load", str(root)], world_size=1)
    want = snapshot(parse_run_config(original, world_size=1), with_data=False)
    assert snapshot(resumed, with_data=False) == want
    alone = parse_run_config(MINIMAL + SHAPE + ["--vocab-size", "96"], world_size=1)
    assert snapshot(alone, with_data=False)[key] != value  # not vacuous


@pytest.mark.parametrize("extra", [[], ["--moe-token-dispatcher-type", "allgather"],
                                   ["--sequence-packing", "--micro-batch-size", "1"]],
                         ids=["unset", "given_as_the_default", "packed"])
def test_a_dispatcher_left_to_the_default_is_not_recorded(tmp_path, extra):
    """The default follows packing (alltoall packed, else allgather): a checkpoint records a
    dispatcher only where the run chose another, so a packed resume of an unpacked run picks
    its own."""
    run = parse_run_config(SHAPE + MOE_ROUTER + ["--vocab-size", "96"] + MINIMAL + extra,
                           world_size=1)
    assert snapshot(run, with_data=False)["moe_token_dispatcher_type"] is None


def _namespace(argv: list[str]):
    """The parsed flags with the checkpoint's taken, before validation (parse_args' order)."""
    parser = build_parser()
    taken = read_checkpoint_flags(argv)
    apply_as_defaults(parser, taken)
    args = parser.parse_args(argv)
    override_command_line(args, taken)
    return args


def test_which_side_wins_beyond_the_shape(tmp_path, capsys):
    """--spec and --tiktoken-num-special-tokens: the checkpoint's replaces the command line's,
    with the line naming the flag; --moe-token-dispatcher-type: the command line's stays."""
    original = SHAPE + TIKTOKEN_SPECIALS + MOE_ROUTER + ["--spec", *SPEC,
                                                         "--moe-token-dispatcher-type",
                                                         "alltoall"] + MINIMAL
    root = _record(tmp_path / "ckpt", 2, original)
    args = _namespace(MINIMAL + USE + ["--load", str(root), "--spec", "my.module", "my_spec",
                                       "--tiktoken-num-special-tokens", "20",
                                       "--moe-token-dispatcher-type", "allgather"])
    assert (args.spec, args.tiktoken_num_special_tokens) == (SPEC, 500)
    assert args.moe_token_dispatcher_type == "allgather"
    out = capsys.readouterr().out
    for line in (f"Setting spec to {SPEC} from checkpoint (overrides --spec "
                 f"{['my.module', 'my_spec']} on the command line)",
                 "Setting tiktoken_num_special_tokens to 500 from checkpoint (overrides "
                 "--tiktoken-num-special-tokens 20 on the command line)",
                 "Keeping --moe-token-dispatcher-type allgather from the command line (the "
                 "checkpoint has alltoall)"):
        assert line in out, out
    args = _namespace(MINIMAL + USE + ["--load", str(_record(tmp_path / "moe", 2,
                                                             SHAPE + ALLTOALL + MINIMAL))])
    assert args.moe_token_dispatcher_type == "alltoall"
    assert "Setting moe_token_dispatcher_type to alltoall from checkpoint" in \
        capsys.readouterr().out


def test_entry_point_exits_2_with_one_line(recorded, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args_or_exit(TRAINING + USE + ["--load", str(_without(recorded, None))])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("pretrain_gpt.py: error: --use-checkpoint-args: checkpoint "), lines


# --- training and export -----------------------------------------------------------------------


def _losses_or_refusal(argv: list[str]) -> dict:
    try:
        return {"losses": [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]}
    except CheckpointError as err:
        return {"refusal": str(err)}


def _training_cases(folder: str) -> dict[str, dict]:
    saved = os.path.join(folder, "saved")
    resume = TRAINING + USE + ["--load", saved, "--ckpt-step", "2"]
    return {
        "save": _losses_or_refusal(ARCHITECTURE + TRAINING + ["--save", saved,
                                                              "--save-interval", "2"]),
        "straight": _losses_or_refusal(ARCHITECTURE + TRAINING),
        "resumed": _losses_or_refusal(resume),
        "forced": _losses_or_refusal(resume + ["--position-embedding-type", "learned_absolute"]),
        "other_size": _losses_or_refusal(resume + ["--num-layers", "2"]),
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[str, dict]:
    folder = str(tmp_path_factory.mktemp("use_ckpt_args"))
    cases = run_distributed(_training_cases, 1, args=(folder,), timeout_s=LAUNCH_TIMEOUT_S)[0]
    return os.path.join(folder, "saved"), cases


def test_resume_without_model_flags_continues_the_straight_run(trained):
    _, cases = trained
    straight = cases["straight"]["losses"]
    assert len(straight) == 4 and cases["save"]["losses"] == straight
    assert cases["resumed"]["losses"] == straight[2:], cases["resumed"]
    assert cases["forced"]["losses"] == straight[2:], cases["forced"]


def test_a_size_given_on_the_command_line_is_refused_at_load(trained):
    _, cases = trained
    refusal = cases["other_size"].get("refusal", "")
    assert "the checkpoint was trained with --num-layers 3, this run has 2" in refusal, cases
    assert "\n" not in refusal


# tools/export_hf.py run as a script (its __main__ guard, with tools/ first on sys.path as
# ``python tools/export_hf.py`` has it) once per argv, in one process: a start-up and the
# imports are most of an export's cost, and each export tears down its own process group.
EXPORTS_SCRIPT = """
import json, runpy, sys
sys.path.insert(0, "tools")
for argv in json.loads(sys.argv[1]):
    sys.argv = ["tools/export_hf.py", *argv]
    runpy.run_path("tools/export_hf.py", run_name="__main__")
"""


def _exports(checkpoint: str, outs: dict[Path, list[str]]) -> list[dict[str, bytes]]:
    """Each out folder's files after an export of ``checkpoint`` with its flags."""
    argvs = [["--load", checkpoint, "--save-hf", str(out), *flags] for out, flags in outs.items()]
    done = subprocess.run(
        [sys.executable, "-c", EXPORTS_SCRIPT, json.dumps(argvs)],
        capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return [{path.name: path.read_bytes() for path in sorted(out.iterdir())} for out in outs]


@needs_extra("hf")
def test_export_with_checkpoint_args_writes_the_same_files(trained, tmp_path):
    checkpoint, _ = trained
    with_flags, with_checkpoint_args = _exports(checkpoint, {tmp_path / "flags": ARCHITECTURE,
                                                             tmp_path / "ckpt_args": USE})
    assert "config.json" in with_flags and any(name.endswith(".safetensors")
                                               for name in with_flags)
    assert with_checkpoint_args == with_flags
