"""megatron-wrap's config format: a view over a nest, its two sections, its
logger keys, both `__select__` forms, Megatron-LM keys sorted into supported / inert /
unsupported (one error naming all), checked against the training layer's real parser."""

import pytest

from megatron.wrap.config import ConfigError, build_config
from megatron.wrap.config.nest_keys import ACCEPTED, megatron_lm_defaults
from tests.unit_tests.wrap.megatron_wrap_format import VIEW, write_nest


def test_view_loads_with_nest_beside_it(tmp_path):
    config = build_config(write_nest(tmp_path))
    flat = config.flat
    # __select__ inside the folder's key, with the chosen file's __inherit__ chain
    assert (flat["num_layers"], flat["hidden_size"], flat["vocab_size"]) == (2, 32, 96)
    assert flat["normalization"] == "RMSNorm" and flat["swiglu"] is True
    # "all" folders load every file; the view's inline keys replace the file's
    assert flat["global_batch_size"] == 4 and flat["seq_length"] == 32 and flat["seed"] == 1234
    assert flat["lr"] == 1.0e-3 and flat["lr_decay_style"] == "constant"
    # a manifest's default selection (dtype: fp32) is loaded without a choice in the view
    assert flat["bf16"] is False
    # Megatron-LM aliases this parser spells differently
    assert flat["position_embedding_type"] == "rope" and flat["disable_bias_linear"] is True
    # megatron_wrap keys become facade keys
    assert config.facade["flow_name"] == "gpt_sft" and config.facade["memory_metrics"] is True
    # inert keys are dropped with a reason, never silently
    assert config.ignored["dino_local_img_size"] == "unset or at Megatron-LM's default"
    assert config.ignored["no_save_optim"] == ACCEPTED["no_save_optim"]
    assert "rank" in config.ignored
    # a flag of the parser (kernel_arguments.py): passed on, Megatron-LM's 0 accepted there
    assert flat["fp8_margin"] == 0 and "fp8_margin" not in config.ignored
    assert "megatron_wrap.init.megatron_lm_project_path" in config.ignored
    # megatron-wrap never builds Megatron-LM's tokenizer; Megatron-LM drops SP when TP is 1
    assert "tokenizer_type" not in flat and "tokenizer_type" in config.ignored
    assert "sequence_parallel" not in flat and "sequence_parallel" in config.ignored


def test_sequence_parallel_is_kept_with_tensor_parallelism(tmp_path):
    config = build_config(write_nest(tmp_path), overrides=[
        "megatron_lm.model.parallel.tensor_model_parallel_size=2"])
    assert config.flat["sequence_parallel"] is True


def test_other_flow_keys_become_flow_args(tmp_path):
    view = VIEW.replace("    __select__: gpt_sft\n", "    __select__: gpt_sft\n    __override__:\n"
                                                    "      loss_normalization: sample\n")
    assert build_config(write_nest(tmp_path, view)).facade["flow_args"] == {
        "loss_normalization": "sample"}


def test_override_reaches_into_the_view(tmp_path):
    config = build_config(write_nest(tmp_path),
                          overrides=["megatron_lm.model.arch.hidden_size=64",
                                     "megatron_lm.train.dtype.bf16=true"])
    assert config.flat["hidden_size"] == 64 and config.flat["bf16"] is True


def test_select_in_view_picks_another_file(tmp_path):
    view = VIEW.replace("  train:\n", "  train:\n    dtype:\n      __select__: bf16\n")
    assert build_config(write_nest(tmp_path, view)).flat["bf16"] is True


def test_logger_keys_map_to_the_wandb_writer(tmp_path):
    view = VIEW.replace("    patch_print: false\n",
                        "    patch_print: true\n    enable_wandb: true\n"
                        "    wandb_project: proj\n    wandb_name: run1\n    wandb_dir: /tmp/w\n"
                        "    wandb_entity: team\n")
    facade = build_config(write_nest(tmp_path, view)).facade
    assert facade["metric_writers"] == ["console", "wandb"]
    assert (facade["wandb_project"], facade["wandb_exp_name"], facade["wandb_save_dir"],
            facade["wandb_entity"], facade["capture_print"]) == ("proj", "run1", "/tmp/w",
                                                                  "team", True)


def test_wandb_settings_without_enable_wandb_are_dropped_with_the_reason(tmp_path):
    """megatron-wrap's switch is logger.enable_wandb: its wandb settings alone log nothing, so
    they must not reach the facade's (refused) wandb keys, nor turn wandb on."""
    view = VIEW.replace("    patch_print: false\n",
                        "    patch_print: false\n    wandb_project: proj\n    wandb_name: run1\n")
    config = build_config(write_nest(tmp_path, view))
    assert config.facade["metric_writers"] == ["console"]
    assert config.facade["wandb_project"] is None and config.facade["wandb_exp_name"] is None
    reason = "logger.enable_wandb is false: megatron-wrap logs nothing to wandb"
    assert config.ignored["megatron_wrap.logger.wandb_project"] == reason
    assert config.ignored["megatron_wrap.logger.wandb_name"] == reason
    from megatron.wrap.runtime import run_config_of

    run, _ = run_config_of(config, world_size=2)  # builds: nothing refused
    assert run.logging.wandb_project is None


def test_megatron_lm_writer_keys_in_a_view(tmp_path):
    """Megatron-LM's --tensorboard-dir turns TensorBoard on (megatron-wrap has no switch for
    it); its --wandb-project without logger.enable_wandb logs nothing in megatron-wrap."""
    config = build_config(write_nest(tmp_path), overrides=[
        "megatron_lm.misc.log.tensorboard_dir=/tmp/tb", "megatron_lm.misc.log.wandb_project=p"])
    assert config.facade["metric_writers"] == ["console", "tensorboard"]
    assert config.facade["tensorboard_dir"] == "/tmp/tb"
    assert config.facade["wandb_project"] is None
    assert config.ignored["wandb_project"] == \
        "logger.enable_wandb is false: megatron-wrap logs nothing to wandb"


def test_log_interval_in_a_view_keeps_megatron_wraps_meaning(tmp_path):
    """megatron-wrap's log_last_metrics() logs at every call whatever Megatron-LM's
    log_interval says; in a native config the key spaces the console line (--log-interval)."""
    from megatron.wrap.runtime import run_config_of

    config = build_config(write_nest(tmp_path), overrides=["log_interval=10"])
    assert "log_interval" not in config.flat
    assert config.ignored["log_interval"].startswith("megatron-wrap's log_last_metrics() logs")
    assert run_config_of(config, world_size=2)[0].logging.log_interval == 1


def test_all_unsupported_keys_in_one_error_with_nearest_flag(tmp_path):
    files = {"megatron_lm/misc/extra.yaml": "dino_head_hidden_size: 999\nlr_warmup_fractoin: 0.1\n"
             "img_h: 512\n"}
    with pytest.raises(ConfigError) as error:
        build_config(write_nest(tmp_path, files=files))
    message = str(error.value)
    assert "\n" not in message and message.startswith("3 Megatron-LM config key(s)")
    assert "dino_head_hidden_size=999" in message and "img_h=512" in message
    assert "lr_warmup_fractoin=0.1 (nearest supported: lr_warmup_" in message
    assert "megatron_lm/misc/extra.yaml" in message


def test_a_hybrid_model_key_in_a_view_names_pretrain_mamba(tmp_path):
    files = {"megatron_lm/misc/extra.yaml": "hybrid_override_pattern: M*\n"}
    with pytest.raises(ConfigError) as error:
        build_config(write_nest(tmp_path, files=files))
    assert "hybrid_override_pattern='M*' (it is pretrain_mamba.py's hybrid-model flag: " \
           "megatron.wrap trains pretrain_gpt.py's GPT models (dense or MoE), train a hybrid " \
           "Mamba model with pretrain_mamba.py)" in str(error.value)


def test_unsupported_wrap_value_and_unknown_view_key(tmp_path):
    bert = {"megatron_wrap/flow/gpt_sft.yaml": "flow_key: gpt_sft\ncompatiable_model_type: BERT\n"}
    with pytest.raises(ConfigError, match="compatiable_model_type' is 'BERT'.*only 'GPT'"):
        build_config(write_nest(tmp_path, files=bert))
    view = VIEW.replace("    common:\n", "    comon:\n")
    with pytest.raises(ConfigError,
                       match="'comon'.*names no file or folder.*did you mean 'common'"):
        build_config(write_nest(tmp_path / "b", view))


def test_missing_choice_is_one_line(tmp_path):
    view = VIEW.replace("    arch:\n      __select__: tiny-llama\n", "")
    with pytest.raises(ConfigError, match=r"nest folder 'megatron_lm/model/arch' .*needs a choice"):
        build_config(write_nest(tmp_path, view))


def test_defaults_table_matches_the_training_parser_where_both_have_a_flag():
    # The table is Megatron-LM's; our parser follows Megatron-LM's defaults for shared flags.
    from megatron.varlen_training.arguments import build_parser
    from megatron.wrap.config.keys import known_keys_of

    ours = known_keys_of(build_parser().flag_actions)
    table = megatron_lm_defaults()
    for key in ("seq_length", "lr", "adam_beta1", "clip_grad", "seed"):
        assert ours[key] in table[key], key


def test_string_select_in_native_format(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "small.yaml").write_text("num_layers: 3\n")
    config = build_config({"model": {"__select__": "small", "hidden_size": 8}},
                          configs_root=tmp_path)
    assert config.flat == {"num_layers": 3, "hidden_size": 8}


def test_lr_below_min_lr_is_one_line_before_megatron_core(tmp_path):
    # The bare AssertionError from megatron-core's scheduler: now the flag layer's line.
    from megatron.varlen_training.flag_errors import ArgumentValidationError
    from megatron.wrap.runtime import run_config_of

    view = VIEW.replace("      lr: 1.0e-3\n", "      lr: 1.0e-5\n      min_lr: 1.0e-4\n")
    with pytest.raises(ArgumentValidationError, match=r"^--min-lr 0\.0001 exceeds --lr 1e-05"):
        run_config_of(build_config(write_nest(tmp_path, view)), world_size=1)


def test_view_builds_a_valid_run(tmp_path):
    from megatron.wrap.runtime import run_config_of

    run, _ = run_config_of(build_config(write_nest(tmp_path)), world_size=2)
    assert run.model.num_layers == 2 and run.training.global_batch_size == 4
    assert run.packing.max_seqlen_per_dp_cp_rank == 2 * 32  # micro_batch_size 2
    # Megatron-LM's runtime flags at their defaults (its nccl included, on CPU too) ask nothing
    from megatron.varlen_training.config.runtime import RuntimeConfig
    assert run.runtime == RuntimeConfig() and run.parallel.distributed_backend is None


def test_native_config_names_all_unknown_keys_at_once():
    with pytest.raises(ConfigError) as error:
        build_config({"model": {"hidden_sise": 8, "num_layer": 2}, "training": {"lr": 1e-3}})
    message = str(error.value)
    assert "\n" not in message and message.startswith("2 unknown config keys")
    assert "'model.hidden_sise'" in message and "did you mean 'hidden_size'" in message
    assert "'model.num_layer'" in message and "did you mean 'num_layers'" in message


@pytest.mark.parametrize("first", ["alias", "direct"])
def test_alias_replaces_a_direct_key_at_its_default_in_any_order(tmp_path, first):
    lines = ["use_rotary_position_embeddings: true\n",
             "position_embedding_type: learned_absolute\n"]
    text = "".join(lines if first == "alias" else lines[::-1])
    config = build_config(write_nest(tmp_path, files={"megatron_lm/misc/pos.yaml": text}))
    assert config.flat["position_embedding_type"] == "rope"


def test_megatron_lm_0_16_norm_epsilon_dest_reaches_the_model(tmp_path):
    """Megatron-LM 0.16.1 keeps --norm-epsilon under the TransformerConfig field's name."""
    files = {"megatron_lm/misc/norm.yaml": "layernorm_epsilon: 1.0e-06\n"}
    config = build_config(write_nest(tmp_path, files=files))
    assert config.flat["norm_epsilon"] == 1e-6


@pytest.mark.parametrize("key", ["apply_layernorm_1p", "layernorm_zero_centered_gamma"])
def test_megatron_lm_layernorm_1p_dests_reach_the_model(tmp_path, key):
    """--apply-layernorm-1p: core 0.8.0's dest (megatron-wrap's nests) and 0.16.1's."""
    files = {"megatron_lm/misc/norm.yaml": f"{key}: true\n"}
    config = build_config(write_nest(tmp_path, files=files))
    assert config.flat["layernorm_zero_centered_gamma"] is True


@pytest.mark.parametrize("value", [32, 64])
def test_megatron_lm_encoder_seq_length_is_the_seq_length(tmp_path, value):
    """Megatron-LM's validate_args copies --seq-length into encoder_seq_length: a namespace
    dumped after it carries both (the nest's seq_length is 32); another value is one line."""
    files = {"megatron_lm/misc/enc.yaml": f"encoder_seq_length: {value}\n"}
    if value != 32:
        with pytest.raises(ConfigError, match="'seq_length' is 32.*asks for 64"):
            build_config(write_nest(tmp_path, files=files))
        return
    assert build_config(write_nest(tmp_path, files=files)).flat["seq_length"] == 32


def test_alias_that_contradicts_an_explicit_key_is_one_line(tmp_path):
    files = {"megatron_lm/misc/pos.yaml": "position_embedding_type: none\n"}
    with pytest.raises(ConfigError, match="'position_embedding_type' is 'none'.*asks for 'rope'"):
        build_config(write_nest(tmp_path, files=files))


def test_stored_yaml_of_a_view_builds_again_without_the_nest(tmp_path):
    config = build_config(write_nest(tmp_path / "run"))
    stored = tmp_path / "wrap_config.yaml"  # as the facade stores it with each checkpoint
    stored.write_text(config.to_yaml())
    again = build_config(stored)
    assert again.flat == config.flat and again.facade == config.facade


def test_bare_override_finds_the_one_place_in_the_view(tmp_path):
    config = build_config(write_nest(tmp_path), overrides=["hidden_size=48", "bf16=true"])
    assert config.flat["hidden_size"] == 48 and config.flat["bf16"] is True
    with pytest.raises(ConfigError, match=r"override 'nope=1' names no place and nothing holds"):
        build_config(write_nest(tmp_path / "b"), overrides=["nope=1"])
