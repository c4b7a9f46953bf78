"""The keys of a megatron-wrap view (config/nest.py) in this fork's terms.

`megatron_lm` holds Megatron-LM's *whole* argument namespace (a megatron-wrap nest lists every
flag, most at their defaults), so its keys are sorted into:

- supported: a dest of this fork's parser (derived from the parser, so flags added later are
  supported without a change here), or a Megatron-LM alias of one (`ALIASES`);
- inert: the value asks for nothing: None, Megatron-LM's own default for the flag (core 0.8.0,
  which megatron-wrap targets, or 0.16.1: `megatron_lm_defaults.json`, a list of its flags and
  defaults), a Megatron-LM run-time attribute that is unset/false, or a key of `ACCEPTED`
  (the value changes nothing here, for the reason given). They are dropped and reported once;
- unsupported: anything else. ALL of them go into one error, each with the closest supported
  flag, so a user fixes a config in one pass.

`megatron_wrap` keys map to facade keys (`WRAP_KEYS`) or are dropped with a reason
(`WRAP_IGNORED`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from megatron.wrap.config.errors import ConfigError, closest, hybrid_model_hint
from megatron.wrap.config.keys import FACADE_KEYS
from megatron.wrap.config.tree import Leaf, Tree

DEFAULTS_FILE = Path(__file__).with_name("megatron_lm_defaults.json")
"""Facts about Megatron-LM's flags: `{dest: [defaults]}` read off the `add_argument` calls of
its `megatron/training/arguments.py` at tags core_v0.8.0 and core_v0.16.1 (literal defaults;
store_true False, store_false True; None where the default is computed)."""
MEGATRON_LM_SECTION = "megatron_lm"
NATIVE_SECTION = "megatron"
"""Where a view's supported Megatron-LM keys land in the native tree: not `megatron_lm`, so the
native tree (`WrapConfig.tree`, stored with checkpoints) builds again as a native config."""
WRAP_SECTION = "megatron_wrap"

_KERNEL = "kernel choice: this fork picks its attention and fusion kernels itself " \
          "(docs/ATTENTION.md); the numbers do not depend on it"
_LOADER = "data loader setting: the facade's samples come from your train() calls"
_LOGGING = "logging detail Megatron-LM no longer has (it always writes the batch size and the " \
           "learning rate) or one-logger telemetry, which this fork has not"
_CKPT_ALL = "checkpoints always hold the optimizer and RNG state; load with no_load_optim / " \
            "no_load_rng to skip them"
ACCEPTED: dict[str, str] = {
    # transformer_impl and use_legacy_models are flags of the parser (kernel_arguments.py),
    # which refuses the values that build another model (inference_optimized, legacy models).
    **dict.fromkeys(("masked_softmax_fusion", "use_flash_attn", "bias_swiglu_fusion",
                     "bias_gelu_fusion", "bias_dropout_fusion", "apply_rope_fusion",
                     "gradient_accumulation_fusion", "bias_activation_fusion"), _KERNEL),
    **dict.fromkeys(("split", "num_workers", "dataloader_type", "data_sharding",
                     "create_attention_mask_in_dataloader", "num_dataset_builder_threads"),
                    _LOADER),
    # The logging flags the parser honours (log_params_norm, tensorboard_queue_size, ...) are
    # not here: they reach the parser and the facade's writers follow them (wrap/runtime.py).
    **dict.fromkeys(("log_batch_size_to_tensorboard", "log_learning_rate_to_tensorboard",
                     "enable_one_logger", "one_logger_project", "one_logger_async"), _LOGGING),
    "log_interval": "megatron-wrap's log_last_metrics() logs at every call (Megatron-LM's "
                    "--log-interval spaced its own loop's lines, which megatron-wrap never ran)",
    **dict.fromkeys(("no_save_optim", "no_save_rng"), _CKPT_ALL),
    **dict.fromkeys(("tokenizer_type", "tokenizer_model", "vocab_file", "merge_file"),
                    "megatron-wrap never builds Megatron-LM's tokenizer (the script tokenizes; "
                    "the model's vocabulary is vocab_size)"),
}
"""Megatron-LM keys accepted with any value, and why the value changes nothing here."""

DROPPED_AT_DEFAULT: dict[str, str] = {
    # Megatron-LM's default is nccl, which a CPU process group cannot use; a nest lists it.
    "distributed_backend": "at Megatron-LM's default (nccl) the facade joins its process group "
                           "with the device's backend (nccl on CUDA, gloo on CPU); another "
                           "value is --distributed-backend",
}
"""Keys of the parser dropped (with the reason) while at Megatron-LM's default: a view lists
every key, and the default asks for nothing the device does not decide better."""

RUNTIME_ATTRIBUTES = ("rank", "local_rank", "world_size", "data_parallel_size",
                      "consumed_train_samples", "consumed_valid_samples", "params_dtype",
                      "pipeline_dtype", "variable_seq_lengths", "gated_linear_unit",
                      "virtual_pipeline_model_parallel_size", "no_sync_func", "param_sync_func",
                      "num_moe_experts", "num_microbatches_with_partial_activation_checkpoints",
                      "model_parallel_size")
"""Attributes of Megatron-LM's args that its code sets at run time (no flag); megatron-wrap's
nest lists them. The facade derives them (ranks from torchrun), so any value is dropped."""

FP8_PREFIX = "fp8_"  # fp8 sub-settings: inert while `fp8` itself is unset


def _rope(value: Any) -> dict[str, Any]:
    return {"position_embedding_type": "rope"} if value else {}


def _no_bias(value: Any) -> dict[str, Any]:
    return {} if value else {"disable_bias_linear": True}


def _position_embedding(value: Any) -> dict[str, Any]:
    return {} if value else {"position_embedding_type": "rope"}  # Megatron-LM: only with rope


ALIASES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "use_rotary_position_embeddings": _rope,   # Megatron-LM: sets --position-embedding-type rope
    "add_bias_linear": _no_bias,               # Megatron-LM's dest of --disable-bias-linear
    "add_position_embedding": _position_embedding,  # --no-position-embedding: rope only
    # Megatron-LM 0.16.1's dest of --norm-epsilon (the TransformerConfig field; 0.8.0's was ours)
    "layernorm_epsilon": lambda value: {"norm_epsilon": value},
    # core 0.8.0's dest of --apply-layernorm-1p (0.16.1's and ours: the TransformerConfig field)
    "apply_layernorm_1p": lambda value: {"layernorm_zero_centered_gamma": value},
    # Megatron-LM's validate_args copies seq_length here: a dumped namespace carries both
    "encoder_seq_length": lambda value: {"seq_length": value},
}
"""Megatron-LM dests that this fork's parser spells differently: key -> value -> our keys."""

WRAP_KEYS: dict[tuple[str, ...], tuple[str, str]] = {
    ("flow", "flow_key"): ("flow", "flow_name"),
    ("flow", "ignored_fields"): ("flow", "ignored_fields"),  # the facade's, not a flow_arg
    ("logger", "patch_print"): ("logging", "capture_print"),
    ("logger", "wandb_project"): ("logging", "wandb_project"),
    ("logger", "wandb_name"): ("logging", "wandb_exp_name"),
    ("logger", "wandb_dir"): ("logging", "wandb_save_dir"),
    ("logger", "wandb_entity"): ("logging", "wandb_entity"),
    ("logger", "add_memory_to_metrics"): ("logging", "memory_metrics"),
}
"""megatron_wrap key path -> (facade section, facade key). `logger.enable_wandb` adds 'wandb'
to `logging.metric_writers`."""

WANDB_LOGGER_KEYS = (("logger", "wandb_project"), ("logger", "wandb_name"),
                     ("logger", "wandb_dir"), ("logger", "wandb_entity"))
WANDB_OFF = "logger.enable_wandb is false: megatron-wrap logs nothing to wandb"
WANDB_PREFIX = "wandb_"  # Megatron-LM's wandb flags, facade keys of the same names
"""The wandb settings of megatron_wrap.logger, dropped (with this reason) while
`logger.enable_wandb` is false: megatron-wrap's switch, not theirs, turns wandb on."""

FLOW_FOLDER = "flow"
"""Other keys of megatron_wrap.flow become the flow's `flow_args` (its __init__ checks them)."""

WRAP_IGNORED: dict[tuple[str, ...], str] = {
    **dict.fromkeys((("init", "megatron_lm_project_path"), ("init", "skip_compile_dependencies"),
                     ("init", "allow_no_cuda"), ("init", "skip_set_jit_fusion")),
                    "megatron.wrap runs the installed packages; nothing to compile or locate"),
    **dict.fromkeys((("logger", "remove_logging"), ("logger", "ignore_warning")),
                    "the rank-aware logger is always on; known warnings are silenced"),
    **dict.fromkeys((("logger", "add_params_norm_to_metrics"),
                     ("logger", "add_throughput_to_metrics"),
                     ("logger", "add_theoretical_memoty_to_metrics")),
                    "train() always returns tflops and throughput (docs/WRAP.md section 4)"),
    **dict.fromkeys((("model_provider", "parallel_output"),
                     ("model_provider", "show_weight_details"),
                     ("model_provider", "encoder_decoder_type")),
                    "the model is this fork's GPT, built from the megatron_lm keys"),
    **dict.fromkeys((("flow", "log_each_step_metrics"), ("flow", "collate_type")),
                    "samples are packed (THD), not padded to seq_length; metrics come per step"),
}
"""megatron_wrap keys that change nothing here, and why."""

WRAP_REQUIRED: dict[tuple[str, ...], Any] = {
    ("flow", "flow_type"): "training",
    ("flow", "compatiable_model_type"): "GPT",  # megatron-wrap's spelling
    ("model_provider", "model_type"): "GPT",
}
"""megatron_wrap keys whose only supported value is the given one."""


@functools.cache
def megatron_lm_defaults() -> dict[str, tuple]:
    """`{dest: (defaults...)}` of Megatron-LM's flags (core 0.8.0 and 0.16.1)."""
    return {key: tuple(values) for key, values in json.loads(DEFAULTS_FILE.read_text()).items()}


def native_tree(tree: Tree, known_keys: Mapping[str, Any]) -> tuple[Tree, dict[str, str]]:
    """A resolved megatron-wrap view as a native tree: `{"megatron": {key: Leaf}, "flow":
    {...}, "logging": {...}}`, and the dropped keys with the reason for each.

    Raises:
        ConfigError: Unsupported Megatron-LM keys (all in one message), a key set twice to
            different values, or a megatron_wrap key with no meaning here.
    """
    ignored: dict[str, str] = {}
    flat = _flatten_leaves(tree.get(MEGATRON_LM_SECTION) or {}, {})
    facade = {key: flat.pop(key) for key in list(flat) if key in FACADE_KEYS}
    cli = _sort_megatron_lm_keys(flat, known_keys, ignored)
    native: Tree = {NATIVE_SECTION: cli}
    wrap_keys = _wrap_keys(tree.get(WRAP_SECTION) or {}, ignored)
    writers = wrap_keys.get(("logging", "metric_writers"))
    wandb_on = writers is not None and "wandb" in writers.value
    for key, leaf in facade.items():  # Megatron-LM's --wandb-project etc. are facade keys here
        if leaf.value is None:
            continue
        if key.startswith(WANDB_PREFIX) and not wandb_on:
            ignored[key] = WANDB_OFF  # megatron-wrap's switch is logger.enable_wandb
        else:
            native.setdefault(FACADE_KEYS[key].section, {})[key] = leaf
    for (section, key), leaf in wrap_keys.items():
        native.setdefault(section, {})[key] = leaf
    _tensorboard_on_with_its_dir(native.get("logging", {}))
    return native, ignored


def _tensorboard_on_with_its_dir(logging: dict) -> None:
    """Megatron-LM's --tensorboard-dir turns TensorBoard on: a view's `tensorboard_dir` adds
    the `tensorboard` writer to `logging.metric_writers` (megatron-wrap has no switch of its
    own for it)."""
    folder = logging.get("tensorboard_dir")
    if folder is None:
        return
    writers = logging.get("metric_writers")
    kinds = list(writers.value) if writers is not None else \
        list(FACADE_KEYS["metric_writers"].default)
    if "tensorboard" not in kinds:
        logging["metric_writers"] = Leaf([*kinds, "tensorboard"], folder.source)


def _flatten_leaves(node: Mapping, out: dict[str, Leaf]) -> dict[str, Leaf]:
    """Every leaf of a nested tree by its last key (Megatron-LM's flat namespace)."""
    for key, child in node.items():
        if not isinstance(child, Leaf):
            _flatten_leaves(child, out)
            continue
        earlier = out.get(key)
        if earlier is not None and earlier.value != child.value:
            raise ConfigError(f"config key '{key}' is {earlier.value!r} in {earlier.source} and "
                              f"{child.value!r} in {child.source}; keep one")
        out[key] = child
    return out


def _sort_megatron_lm_keys(flat: dict[str, Leaf], known_keys: Mapping[str, Any],
                           ignored: dict[str, str]) -> dict[str, Leaf]:
    cli: dict[str, Leaf] = {}
    unsupported: list[str] = []
    _sequence_parallel_off_without_tp(flat, ignored)
    for key, leaf in flat.items():
        if key in DROPPED_AT_DEFAULT and _at_megatron_lm_default(key, leaf.value):
            ignored[key] = DROPPED_AT_DEFAULT[key]
        elif key in known_keys and key not in ACCEPTED:
            cli[key] = leaf
        elif key in ALIASES:
            continue  # after every direct key, which an alias may replace
        elif _inert(key, leaf.value, flat):
            ignored[key] = ACCEPTED.get(key, "unset or at Megatron-LM's default")
        else:
            unsupported.append(key)
    if unsupported:
        raise ConfigError(unsupported_keys_message(unsupported, flat, known_keys))
    for key in ALIASES:
        if key in flat and flat[key].value is not None:
            for our_key, value in ALIASES[key](flat[key].value).items():
                _set_alias(cli, flat, our_key, Leaf(value, f"{flat[key].source} ({key})"))
    return cli


SEQUENCE_PARALLEL_WITHOUT_TP = "Megatron-LM turns sequence parallelism off when " \
                               "tensor_model_parallel_size is 1"


def _sequence_parallel_off_without_tp(flat: dict[str, Leaf], ignored: dict[str, str]) -> None:
    """Megatron-LM's rule (a warning, then off), which megatron-wrap's nest relies on: its
    parallel file sets sequence_parallel: true for any TP size. This fork's parser applies the
    same rule with the same warning; the view drops the key before it, so that the view's
    ignored keys say why (every rank's config lists them, the warning is rank 0's line)."""
    tp = getattr(flat.get("tensor_model_parallel_size"), "value", None)
    if tp in (None, 1) and getattr(flat.get("sequence_parallel"), "value", None):
        del flat["sequence_parallel"]
        ignored["sequence_parallel"] = SEQUENCE_PARALLEL_WITHOUT_TP


def _set_alias(cli: dict[str, Leaf], flat: dict[str, Leaf], key: str, leaf: Leaf) -> None:
    given = flat.get(key)
    if given is not None and given.value not in (None, leaf.value) and \
            given.value != megatron_lm_defaults().get(key, (None,))[0]:
        raise ConfigError(f"config key '{key}' is {given.value!r} (from {given.source}) but "
                          f"{leaf.source} asks for {leaf.value!r}; keep one")
    cli[key] = leaf


def _inert(key: str, value: Any, flat: Mapping[str, Leaf]) -> bool:
    if value is None or key in ACCEPTED or key in RUNTIME_ATTRIBUTES:
        return True
    if key.startswith(FP8_PREFIX) and getattr(flat.get("fp8"), "value", None) is None:
        return True
    return any(_same(value, default) for default in megatron_lm_defaults().get(key, ()))


def _at_megatron_lm_default(key: str, value: Any) -> bool:
    return any(_same(value, default) for default in megatron_lm_defaults().get(key, ()))


def _same(value: Any, default: Any) -> bool:
    # YAML reads `1.e-08` as text and `2` for `2.0`: compare as numbers where both are numbers.
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    if isinstance(value, (int, float)) and isinstance(default, (int, float)):
        return float(value) == float(default)
    return value == default


def unsupported_keys_message(keys: list[str], flat: Mapping[str, Leaf],
                             known_keys: Mapping[str, Any]) -> str:
    """One line naming every unsupported key, its value and source, and the closest flag."""
    parts = []
    for key in keys:
        match = closest(key, known_keys)
        hint = f"nearest supported: {match}" if match else "no close supported flag"
        hybrid = hybrid_model_hint(key)  # "; it is ...": a clause of its own here
        parts.append(f"{key}={flat[key].value!r} ({hybrid[2:] if hybrid else hint})")
    sources = sorted({flat[key].source for key in keys})
    return (f"{len(keys)} Megatron-LM config key(s) not supported by this fork with the given "
            f"value: {'; '.join(parts)} [from {', '.join(sources)}]; set them to null or "
            f"Megatron-LM's default, or remove them (docs/WRAP_CONFIG.md section 7)")


def _wrap_keys(node: Mapping, ignored: dict[str, str]) -> dict[tuple[str, str], Any]:
    """Facade `(section, key) -> Leaf` (a mapping of them for `flow_args`) of megatron_wrap."""
    out: dict[tuple[str, str], Any] = {}
    leaves = _leaf_paths(node, ())
    enable_wandb = leaves.pop(("logger", "enable_wandb"), None)
    if enable_wandb is not None and enable_wandb.value:
        out[("logging", "metric_writers")] = Leaf(["console", "wandb"], enable_wandb.source)
    else:  # megatron-wrap logs nothing to wandb then, whatever its wandb settings say
        for path in WANDB_LOGGER_KEYS:
            if path in leaves and leaves[path].value is not None:
                del leaves[path]
                ignored[".".join((WRAP_SECTION, *path))] = WANDB_OFF
    flow_args: dict[str, Any] = {}
    for path, leaf in leaves.items():
        name = ".".join((WRAP_SECTION, *path))
        if path in WRAP_KEYS:
            out[WRAP_KEYS[path]] = leaf
        elif path in WRAP_IGNORED:
            ignored[name] = WRAP_IGNORED[path]
        elif path in WRAP_REQUIRED:
            if leaf.value != WRAP_REQUIRED[path]:
                raise ConfigError(f"config key '{name}' is {leaf.value!r} (from {leaf.source}); "
                                  f"megatron.wrap supports only {WRAP_REQUIRED[path]!r}")
        elif len(path) == 2 and path[0] == FLOW_FOLDER:
            flow_args[path[1]] = leaf  # megatron-wrap hands its flow config to the flow
        else:
            known = [".".join(p) for p in (*WRAP_KEYS, *WRAP_IGNORED, *WRAP_REQUIRED)]
            match = closest(".".join(path), known)
            hint = f"; did you mean '{WRAP_SECTION}.{match}'?" if match else ""
            raise ConfigError(f"unknown config key '{name}' (from {leaf.source}){hint}")
    if flow_args:
        out[("flow", "flow_args")] = {key: leaf for key, leaf in flow_args.items()}
    return out


def _leaf_paths(node: Mapping, prefix: tuple[str, ...]) -> dict[tuple[str, ...], Leaf]:
    out: dict[tuple[str, ...], Leaf] = {}
    for key, child in node.items():
        if isinstance(child, Leaf):
            out[(*prefix, key)] = child
        else:
            out.update(_leaf_paths(child, (*prefix, key)))
    return out
