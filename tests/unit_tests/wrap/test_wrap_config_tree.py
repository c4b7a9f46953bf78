"""Config tree semantics: select, inherit chains, override precedence, cycles, missing files."""

import subprocess
import sys

import pytest

from megatron.wrap.config import DEFAULT_CONFIGS_ROOT, ConfigError, build_config


def build(root, source, known_keys, overrides=None):
    path = root / source if isinstance(source, str) else source
    return build_config(path, overrides=overrides, configs_root=root, known_keys=known_keys)


def test_select_merges_the_chosen_file_into_its_section(write_configs, known_keys):
    root = write_configs({
        "model/small.yaml": "num_layers: 2\nhidden_size: 64\n",
        "model/big.yaml": "num_layers: 24\nhidden_size: 2048\n",
        "run.yaml": "__select__: {model: small}\ntraining: {seed: 7}\n",
    })
    config = build(root, "run.yaml", known_keys)
    assert config.flat == {"num_layers": 2, "hidden_size": 64, "seed": 7}
    assert config.sources["num_layers"] == "model/small.yaml"
    assert config.tree["model"] == {"num_layers": 2, "hidden_size": 64}


def test_select_accepts_suffix_and_subfolders(write_configs, known_keys):
    root = write_configs({
        "model/llama/tiny.yaml": "num_layers: 3\n",
        "run.yaml": "__select__: {model: llama/tiny.yaml}\n",
    })
    assert build(root, "run.yaml", known_keys).flat == {"num_layers": 3}


def test_inherit_chain_parent_first_child_wins(write_configs, known_keys):
    root = write_configs({
        "base.yaml": "model: {num_layers: 1, hidden_size: 8, ffn_hidden_size: 32}\n",
        "mid/parent.yaml": "__inherit__: ../base.yaml\nmodel: {hidden_size: 16}\n",
        "mid/child.yaml": "__inherit__: parent.yaml\nmodel: {ffn_hidden_size: 64}\n",
    })
    config = build(root, "mid/child.yaml", known_keys)
    assert config.flat == {"num_layers": 1, "hidden_size": 16, "ffn_hidden_size": 64}
    assert config.sources == {
        "num_layers": "base.yaml",
        "hidden_size": "mid/parent.yaml",
        "ffn_hidden_size": "mid/child.yaml",
    }


def test_inherit_list_later_parent_wins(write_configs, known_keys):
    root = write_configs({
        "a.yaml": "training: {seed: 1, train_iters: 10}\n",
        "b.yaml": "training: {seed: 2}\n",
        "run.yaml": "__inherit__: [a.yaml, b.yaml]\n",
    })
    assert build(root, "run.yaml", known_keys).flat == {"seed": 2, "train_iters": 10}


def test_precedence_select_inline_override_then_build_overrides(write_configs, known_keys):
    root = write_configs({
        "model/m.yaml": "num_layers: 1\nhidden_size: 1\nffn_hidden_size: 1\nseq_length: 1\n",
        "run.yaml": """
            __select__: {model: m}
            model: {hidden_size: 2, ffn_hidden_size: 2, seq_length: 2}
            __override__: {model.ffn_hidden_size: 3, model.seq_length: 3}
            """,
    })
    config = build(root, "run.yaml", known_keys, overrides=["model.seq_length=4"])
    assert config.flat == {"num_layers": 1, "hidden_size": 2, "ffn_hidden_size": 3, "seq_length": 4}
    assert config.sources["ffn_hidden_size"] == "run.yaml (__override__)"
    assert config.sources["seq_length"] == "override 'model.seq_length=4'"


def test_child_inline_beats_parent_override(write_configs, known_keys):
    # A parent's __override__ is part of the resolved parent; the child still wins over it.
    root = write_configs({
        "parent.yaml": "training: {seed: 1}\n__override__: {training.seed: 2}\n",
        "child.yaml": "__inherit__: parent.yaml\ntraining: {seed: 3}\n",
    })
    assert build(root, "child.yaml", known_keys).flat == {"seed": 3}


def test_outer_override_beats_inner_override(write_configs, known_keys):
    root = write_configs({
        "run.yaml": """
            training:
              seed: 1
              __override__: {seed: 2}
            __override__: {training.seed: 3}
            """,
    })
    assert build(root, "run.yaml", known_keys).flat == {"seed": 3}


def test_select_replaces_inherited_section(write_configs, known_keys):
    root = write_configs({
        "model/gqa.yaml": "num_layers: 2\ngroup_query_attention: true\nnum_query_groups: 2\n",
        "model/plain.yaml": "num_layers: 4\n",
        "parent.yaml": "__select__: {model: gqa}\n",
        "child.yaml": "__inherit__: parent.yaml\n__select__: {model: plain}\n",
    })
    assert build(root, "child.yaml", known_keys).flat == {"num_layers": 4}


def test_build_overrides_apply_in_order_and_parse_yaml_values(write_configs, known_keys):
    root = write_configs({"run.yaml": "optimizer: {lr: 0.1}\ndata: {data_path: [a]}\n"})
    overrides = ["optimizer.lr=1e-4", "optimizer.lr=2e-4", "data.data_path=[x, y]",
                 "model.swiglu=true", "checkpoint.save=", "data.tokenizer_model=tok"]
    config = build(root, "run.yaml", known_keys, overrides=overrides)
    assert config.flat == {"lr": 2e-4, "data_path": ["x", "y"], "swiglu": True, "save": None,
                           "tokenizer_model": "tok"}


def test_bare_override_key_goes_to_the_section_holding_it(write_configs, known_keys):
    root = write_configs({"run.yaml": "optimizer: {lr: 0.1}\n"})
    config = build(root, "run.yaml", known_keys, overrides=["lr=0.5", "log_level=DEBUG"])
    assert config.flat == {"lr": 0.5}
    assert config.facade["log_level"] == "DEBUG"
    with pytest.raises(ConfigError, match=r"names no section.*'<section>\.seed=\.\.\.'"):
        build(root, "run.yaml", known_keys, overrides=["seed=1"])


def test_mapping_overrides_keep_python_values(write_configs, known_keys):
    root = write_configs({"run.yaml": "optimizer: {lr: 0.1}\n"})
    overrides = {"optimizer.lr": 0.3, "model": {"num_layers": 5}}
    assert build(root, "run.yaml", known_keys, overrides).flat == {"lr": 0.3, "num_layers": 5}


@pytest.mark.parametrize("bad", ["model.num_layers", "=3", "model..x=1"])
def test_malformed_override_is_an_error(write_configs, known_keys, bad):
    root = write_configs({"run.yaml": "{}\n"})
    with pytest.raises(ConfigError, match="override|malformed"):
        build(root, "run.yaml", known_keys, overrides=[bad])


def test_exponent_only_numbers_are_floats(write_configs, known_keys):
    root = write_configs({"run.yaml": "optimizer: {lr: 1e-4, min_lr: 5E-6, weight_decay: 1.e-2}"})
    flat = build(root, "run.yaml", known_keys).flat
    assert flat == {"lr": 1e-4, "min_lr": 5e-6, "weight_decay": 1e-2}
    assert all(isinstance(value, float) for value in flat.values())


def test_duplicate_yaml_key_names_file_and_line(write_configs, known_keys):
    root = write_configs({"run.yaml": "model:\n  num_layers: 1\n  num_layers: 2\n"})
    with pytest.raises(ConfigError, match=r"duplicate key 'num_layers' in run\.yaml, line 3"):
        build(root, "run.yaml", known_keys)


@pytest.mark.parametrize(
    "files, chain",
    [
        ({"a.yaml": "__inherit__: b.yaml\n", "b.yaml": "__inherit__: a.yaml\n"},
         "a.yaml -> b.yaml -> a.yaml"),
        ({"a.yaml": "__inherit__: a.yaml\n"}, "a.yaml -> a.yaml"),
        ({"a.yaml": "__select__: {model: m}\n", "model/m.yaml": "__inherit__: ../a.yaml\n"},
         "a.yaml -> model/m.yaml -> a.yaml"),
        ({"a.yaml": "__select__: {model: m}\n", "model/m.yaml": "__select__: {model: m}\n"},
         "model/m.yaml -> model/m.yaml"),
    ],
)
def test_cycles_are_errors_naming_the_chain(write_configs, known_keys, files, chain):
    root = write_configs(files)
    with pytest.raises(ConfigError, match=f"config cycle: {chain}$"):
        build(root, "a.yaml", known_keys)


def test_the_same_file_twice_without_a_cycle_is_fine(write_configs, known_keys):
    root = write_configs({
        "common.yaml": "training: {seed: 1}\n",
        "a.yaml": "__inherit__: common.yaml\n",
        "run.yaml": "__inherit__: [common.yaml, a.yaml]\n",
    })
    assert build(root, "run.yaml", known_keys).flat == {"seed": 1}


def test_missing_selected_file_names_folder_and_choices(write_configs, known_keys):
    root = write_configs({"model/tiny.yaml": "", "model/big.yaml": "",
                          "run.yaml": "__select__: {model: tiny_gpt}\n"})
    expected = r"'tiny_gpt' \(from run\.yaml\) is not in folder 'model'; choices: big, tiny; did"
    with pytest.raises(ConfigError, match=expected):
        build(root, "run.yaml", known_keys)


def test_empty_selection_lists_choices(write_configs, known_keys):
    root = write_configs({"model/tiny.yaml": "", "run.yaml": "__select__: {model: null}\n"})
    with pytest.raises(ConfigError, match="folder 'model' .* needs a file name; choices: tiny$"):
        build(root, "run.yaml", known_keys)


def test_missing_select_folder_lists_folders(write_configs, known_keys):
    root = write_configs({"model/tiny.yaml": "", "run.yaml": "__select__: {modle: tiny}\n"})
    with pytest.raises(ConfigError, match="folder 'modle' .* folders: model; did you mean 'model'"):
        build(root, "run.yaml", known_keys)


def test_missing_inherit_file_is_an_error(write_configs, known_keys):
    root = write_configs({"run.yaml": "__inherit__: nothere.yaml\n"})
    with pytest.raises(ConfigError, match=r"__inherit__ file 'nothere\.yaml' \(from run\.yaml\)"):
        build(root, "run.yaml", known_keys)


@pytest.mark.parametrize(
    "text, message",
    [
        ("__selct__: {model: m}\n", "unknown directive '__selct__'.*did you mean '__select__'"),
        ("__select__: model\n", "__select__ in run.yaml must map folder to choice"),
        ("__inherit__: {a: 1}\n", "__inherit__ in run.yaml must be a path"),
        ("__override__: [1]\n", "__override__ in run.yaml must be a mapping"),
        ("- 1\n", "run.yaml must hold a mapping, not list"),
        ("model: [\n", "invalid YAML in run.yaml"),
    ],
)
def test_malformed_directives_and_files(write_configs, known_keys, text, message):
    root = write_configs({"run.yaml": text})
    with pytest.raises(ConfigError, match=message):
        build(root, "run.yaml", known_keys)


def test_dict_source_inherits_relative_to_the_configs_root(write_configs, known_keys):
    root = write_configs({"base.yaml": "training: {seed: 1, train_iters: 5}\n"})
    source = {"__inherit__": "base.yaml", "training": {"seed": 2}}
    config = build_config(source, configs_root=root, known_keys=known_keys)
    assert config.flat == {"seed": 2, "train_iters": 5}
    assert config.sources["seed"] == "<dict>"


def test_configs_roots_are_searched_in_order(write_configs, known_keys):
    root = write_configs({"model/tiny_gpt.yaml": "num_layers: 9\n"})
    config = build_config({"__select__": {"model": "tiny_gpt", "optimizer": "adam_cosine"}},
                          configs_root=[root, DEFAULT_CONFIGS_ROOT], known_keys=known_keys)
    assert config.flat["num_layers"] == 9
    assert config.flat["lr_decay_style"] == "cosine"


def test_missing_config_file_is_an_error(tmp_path, known_keys):
    with pytest.raises(ConfigError, match="config file not found"):
        build_config(tmp_path / "none.yaml", known_keys=known_keys)


def test_builds_in_a_plain_process_without_torch():
    code = (
        "import sys\n"
        "from megatron.wrap.config import build_config, config_path\n"
        "config = build_config(config_path('sft_tiny_cpu'), known_keys={k: None for k in "
        "'num_layers hidden_size ffn_hidden_size num_attention_heads seq_length "
        "max_position_embeddings vocab_size init_method_std hidden_dropout attention_dropout "
        "bf16 fp16 tensor_model_parallel_size pipeline_model_parallel_size context_parallel_size "
        "sequence_packing max_seqlen_per_dp_cp_rank lr min_lr lr_decay_style lr_warmup_iters "
        "weight_decay clip_grad adam_beta1 adam_beta2 log_interval micro_batch_size "
        "global_batch_size train_iters eval_interval eval_iters seed sft mock_data tokenizer_type "
        "sft_mock_dataset_config_json save load'.split()})\n"
        "assert config.flat['num_layers'] == 2\n"
        "assert 'torch' not in sys.modules, 'building a config must not import torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
