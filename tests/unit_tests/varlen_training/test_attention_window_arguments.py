"""``--window-size`` / ``--window-attn-skip-freq``: Megatron-LM's syntax, one-line refusals for
what the causal attentions cannot run, and what a resume or fine-tune does with them. The
config fields against Megatron-LM's are in test_transformer_config_reference.py, training on
every layout in test_sliding_window_training.py."""

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.model import build_transformer_config
from tools.probe_combinations import cell_argv

ARGV, _, _ = cell_argv("dense", "u_single", "none")  # 4 layers


def _run(*flags, argv=ARGV):
    return parse_run_config(list(argv) + list(flags), world_size=1)


@pytest.mark.parametrize("text", ["128,0", "(128,0)", " (128, 0) "])
def test_megatron_lms_tuple_syntax(text):
    run = _run("--window-size", text)
    assert run.model.window_size == (128, 0)
    assert build_transformer_config(run).window_size == (128, 0)


def test_a_pattern_becomes_megatron_cores_list():
    run = _run("--window-size", "8,0", "--window-attn-skip-freq", "([1]*1+[0]*1)*2")
    assert run.model.window_attn_skip_freq == (1, 0, 1, 0)
    config = build_transformer_config(run)
    assert config.window_attn_skip_freq == [1, 0, 1, 0]  # megatron-core wants a list
    assert build_transformer_config(
        _run("--window-size", "8,0", "--window-attn-skip-freq", "3")).window_attn_skip_freq == 3


@pytest.mark.parametrize("flags, words", [
    (("--window-size", "8,2"), ["--window-size 8,2", "right 2 must be 0"]),
    (("--window-size", "(-3,0)"), ["--window-size -3,0", "left -3"]),
    (("--window-size", "8"), ["--window-size 8", "two ints"]),
    (("--window-size", "a,0"), ["--window-size", "two ints"]),
    (("--window-attn-skip-freq", "2"), ["--window-attn-skip-freq", "needs --window-size"]),
    (("--window-size", "8,0", "--window-attn-skip-freq", "0"), ["--window-attn-skip-freq 0",
                                                                ">= 1"]),
    (("--window-size", "8,0", "--window-attn-skip-freq", "[1,0,1]"),
     ["--window-attn-skip-freq has 3 entries", "--num-layers 4"]),
    (("--window-size", "8,0", "--window-attn-skip-freq", "[1,0,1,0]", "--mtp-num-layers", "1"),
     ["--window-attn-skip-freq", "--mtp-num-layers 1", "give an int"]),
    (("--window-size", "8,0", "--window-attn-skip-freq", "[2,0,1,0]"),
     ["--window-attn-skip-freq", "list of 0/1"]),
])
def test_what_cannot_run_is_refused_in_one_line(flags, words, capsys):
    with pytest.raises((ArgumentValidationError, SystemExit)) as err:
        _run(*flags)
    message = str(err.value) if err.type is ArgumentValidationError else capsys.readouterr().err
    for word in words:
        assert word in message, (word, message)
    if err.type is ArgumentValidationError:
        assert "\n" not in message
    else:
        assert err.value.code == 2


def test_a_resume_keeps_the_window_a_fine_tune_may_change_it(tmp_path):
    """The weights do not depend on the window: --finetune may change it (as RoPE fine-tunes
    at another --seq-length); a resume continuing the run may not."""
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.load_options import FINETUNE
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    save_run_args(str(tmp_path), _run("--window-size", "8,0"), iteration=3)
    check_run_args(str(tmp_path), _run("--window-size", "(8,0)"), check_data=False)
    for other in (_run(), _run("--window-size", "16,0"),
                  _run("--window-size", "8,0", "--window-attn-skip-freq", "2")):
        with pytest.raises(CheckpointError) as err:
            check_run_args(str(tmp_path), other, check_data=False)
        assert "--window" in str(err.value) and "\n" not in str(err.value)
        check_run_args(str(tmp_path), other, check_data=False, parts=FINETUNE)


def test_checkpoints_from_before_had_no_window(tmp_path):
    import json
    import os

    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    save_run_args(str(tmp_path), _run(), iteration=3)
    path = os.path.join(tmp_path, "run_args.json")
    with open(path) as handle:
        recorded = json.load(handle)
    assert recorded["window_size"] is None and recorded["window_attn_skip_freq"] is None
    for key in ("window_size", "window_attn_skip_freq"):
        del recorded[key]
    with open(path, "w") as handle:
        json.dump(recorded, handle)
    check_run_args(str(tmp_path), _run(), check_data=False)


# A megatron.wrap config tree gives values as YAML data: Megatron-LM's YAML configs write the
# window and the per-layer patterns as lists, and an int frequency as an int.
TREE = dict(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=64,
            micro_batch_size=1, global_batch_size=2, train_iters=1, lr=1e-3, mock_data=True,
            tokenizer_type="NullTokenizer", vocab_size=128)


@pytest.mark.parametrize("values, expected", [
    ({"window_size": [8, 0], "window_attn_skip_freq": [1, 0, 1, 0]},
     ((8, 0), [1, 0, 1, 0], 1)),
    ({"window_size": "(8,0)", "window_attn_skip_freq": 2}, ((8, 0), 2, 1)),
    ({"num_experts": 4, "disable_bias_linear": True, "moe_layer_freq": 2}, (None, None, 2)),
    ({"num_experts": 4, "disable_bias_linear": True, "moe_layer_freq": [0, 1, 1, 1]},
     (None, None, [0, 1, 1, 1])),
])
def test_config_tree_values_equal_their_command_line(values, expected):
    """The facade's values and the command line megatron.wrap renders from them parse alike
    (an int frequency used to end in an AttributeError, a list was refused)."""
    from megatron.varlen_training.arguments import build_parser, parse_args
    from megatron.varlen_training.flag_values import parse_values
    from megatron.wrap.config.argv import flat_config_to_argv

    tree = {**TREE, **values}
    for args in (parse_values(tree, world_size=1),
                 parse_args(flat_config_to_argv(tree, build_parser("pretrain_gpt.py")))):
        assert (args.window_size, args.window_attn_skip_freq, args.moe_layer_freq) == expected


def test_a_bad_list_in_a_config_tree_is_one_line():
    from megatron.varlen_training.flag_values import parse_values

    with pytest.raises(ArgumentValidationError) as err:
        parse_values({**TREE, "window_size": [8, 0], "window_attn_skip_freq": [2, 0, 1, 0]},
                     world_size=1)
    assert "--window-attn-skip-freq" in str(err.value) and "\n" not in str(err.value)
