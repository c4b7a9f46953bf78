"""A resume with --use-distributed-optimizer (dp_reshardable state) compares the pipeline layout
the flags give, not how they spell it: the state's buffers are the model chunks', so the same
layers in every chunk resume, whichever of Megatron-LM's flags placed them, and another
placement is refused in one line. Function level (save_run_args -> check_run_args), no launch;
the end-to-end refusal of a real VPP change is test_resume_consistency.py's 2-rank test."""

import json

import pytest

from megatron.varlen_training.checkpoint.sharding import FULLY_RESHARDABLE, SHARDING_TYPE_KEY
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import LoadParts
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_keys import (
    PIPELINE_CHUNKS_KEY, RUN_ARGS_FILENAME, VIRTUAL_PIPELINE_SIZE_KEY,
)
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.harness.training_runs import TINY_GPT_ARGS

PER_STAGE = "--num-layers-per-virtual-pipeline-stage"
STAGES = "--num-virtual-stages-per-pipeline-rank"
FIRST = "--decoder-first-pipeline-num-layers"
LAYOUT = "--pipeline-model-parallel-layout"
LOSS = "--account-for-loss-in-pipeline-split"
WORLD = 2  # PP 2, DP 1


def _run(num_layers: int, *pipeline: str):
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", str(num_layers),
                           "--pipeline-model-parallel-size", "2",
                           "--use-distributed-optimizer", *pipeline]
    return parse_run_config(argv, world_size=WORLD)


# (layers, saved with, resumed with, [pp_rank][vp_stage] decoder layers counted by hand)
EQUIVALENT = [
    (4, [PER_STAGE, "1"], [STAGES, "2"], [[1, 1], [1, 1]]),
    (4, [STAGES, "2"], [PER_STAGE, "1"], [[1, 1], [1, 1]]),
    (8, [PER_STAGE, "2"], [STAGES, "2"], [[2, 2], [2, 2]]),
    # one virtual stage per rank is no virtual pipeline (Megatron-LM: size None)
    (4, [PER_STAGE, "2"], [], [[2], [2]]),
    (4, [], [STAGES, "1"], [[2], [2]]),
    # the loss counted as a layer of the last stage: (5 + 1) / 2 each, so 3 then 2 decoder
    (5, [LOSS], [FIRST, "3"], [[3], [2]]),
    (5, [FIRST, "3"], [LAYOUT, "Ettt|ttL"], [[3], [2]]),
]


@pytest.mark.parametrize("layers, saved_with, resumed_with, chunks", EQUIVALENT)
def test_equivalent_pipeline_flags_resume(tmp_path, layers, saved_with, resumed_with, chunks):
    save_run_args(str(tmp_path), _run(layers, *saved_with))
    recorded = json.loads((tmp_path / RUN_ARGS_FILENAME).read_text())
    assert recorded[PIPELINE_CHUNKS_KEY] == chunks
    assert recorded[VIRTUAL_PIPELINE_SIZE_KEY] == (len(chunks[0]) if len(chunks[0]) > 1
                                                   else None)
    assert check_run_args(str(tmp_path), _run(layers, *resumed_with), check_data=False) is None


def test_checkpoint_from_before_the_layout_was_recorded(tmp_path):
    """A run_args.json without the layout keys gets the layout from its recorded flags: an
    equivalent spelling resumes, another layout is refused."""
    save_run_args(str(tmp_path), _run(4, PER_STAGE, "1"))
    path = tmp_path / RUN_ARGS_FILENAME
    recorded = json.loads(path.read_text())
    del recorded[PIPELINE_CHUNKS_KEY], recorded[VIRTUAL_PIPELINE_SIZE_KEY]
    path.write_text(json.dumps(recorded))
    assert check_run_args(str(tmp_path), _run(4, STAGES, "2"), check_data=False) is None
    with pytest.raises(CheckpointError, match=f"saved with {PER_STAGE} 1, this run has none"):
        check_run_args(str(tmp_path), _run(4), check_data=False)


@pytest.mark.parametrize("saved_with, resumed_with, named", [
    ([PER_STAGE, "1"], [STAGES, "2"], f"saved with {PER_STAGE} 1, this run has none"),
    ([STAGES, "4"], [], f"saved with {STAGES} 4, this run has none"),
    ([FIRST, "2"], [FIRST, "6"], f"saved with {FIRST} 2, this run has 6"),
])
def test_another_layout_is_refused_in_one_line(tmp_path, saved_with, resumed_with, named):
    """8 layers over PP 2: 4 chunks of 1 layer per rank vs 2 chunks of 2 (and 2 + 6 vs 6 + 2
    layers per stage) are other buffers; --no-load-optim loads the weights alone, and a save
    in the fully reshardable format follows the change."""
    save_run_args(str(tmp_path), _run(8, *saved_with))
    with pytest.raises(CheckpointError, match=named) as err:
        check_run_args(str(tmp_path), _run(8, *resumed_with), check_data=False)
    message = str(err.value)
    assert "\n" not in message and "--no-load-optim" in message
    assert "--dist-ckpt-optim-fully-reshardable" in message
    assert check_run_args(str(tmp_path), _run(8, *resumed_with), check_data=False,
                          parts=LoadParts(optimizer=False)) is None
    path = tmp_path / RUN_ARGS_FILENAME
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                SHARDING_TYPE_KEY: FULLY_RESHARDABLE}))
    assert check_run_args(str(tmp_path), _run(8, *resumed_with), check_data=False) is None
