"""A small config nest and view in megatron-wrap's format (confignest), written for these tests.

Same layout rules as megatron-wrap's `configs/nest` (a folder per group, a
`__confignest_manifest__` where one file must be chosen, a `megatron_lm` and a `megatron_wrap`
part), with our own tiny values.
"""

from pathlib import Path

NEST_FILES = {
    "megatron_lm/model/arch/__confignest_manifest__": "selection_mode: one\n",
    "megatron_lm/model/arch/base-lm.yaml": (
        "num_layers: null\nhidden_size: null\nnum_attention_heads: null\n"
        "vocab_size: null\nmax_position_embeddings: null\n"
        "use_rotary_position_embeddings: true\nadd_position_embedding: false\n"
        "add_bias_linear: false\nswiglu: true\nnormalization: RMSNorm\n"
        "hidden_dropout: 0.0\nattention_dropout: 0.0\n"
        "masked_softmax_fusion: false\nbias_dropout_fusion: true\n"
        "dino_local_img_size: 96\nretro_encoder_layers: 2\n"
    ),
    "megatron_lm/model/arch/tiny-llama.yaml": (
        "__inherit__: base-lm.yaml\nnum_layers: 2\nhidden_size: 32\nffn_hidden_size: 64\n"
        "num_attention_heads: 4\nvocab_size: 96\nmax_position_embeddings: 64\n"
        "untie_embeddings_and_output_weights: true\n"
    ),
    "megatron_lm/model/parallel/__confignest_manifest__": "selection_mode: one\n",
    "megatron_lm/model/parallel/plain.yaml": (
        "tensor_model_parallel_size: 1\npipeline_model_parallel_size: 1\n"
        "context_parallel_size: 1\nrank: 0\nworld_size: null\nsequence_parallel: true\n"
    ),
    "megatron_lm/train/common.yaml": (
        "micro_batch_size: null\nglobal_batch_size: null\nseq_length: null\n"
        "train_iters: null\nsave_interval: null\nsave: null\nseed: 1234\n"
        "no_save_optim: true\n"
    ),
    "megatron_lm/train/learning-rate.yaml": "lr: null\nmin_lr: 0.0\nlr_decay_style: constant\n",
    "megatron_lm/train/dtype/__confignest_manifest__": (
        "selection_mode: one\nif_no_selection: default\ndefault_selection: fp32\n"
    ),
    "megatron_lm/train/dtype/fp32.yaml": "fp16: false\nbf16: false\nfp8: null\nfp8_margin: 0\n",
    "megatron_lm/train/dtype/bf16.yaml": "fp16: false\nbf16: true\n",
    "megatron_lm/misc/log.yaml": (
        "log_interval: 1\nlog_throughput: true\nwandb_project: null\n"
        "tokenizer_type: GPTSentencePieceTokenizer\ntokenizer_model: null\n"
        "log_interval: 1\n"  # a repeated key with the same value, as megatron-wrap's nest has
    ),
    # Megatron-LM's runtime flags at its defaults, as a nest of its whole namespace lists them
    "megatron_lm/misc/runtime.yaml": (
        "distributed_backend: nccl\nmanual_gc: false\nmanual_gc_interval: 0\n"
        "manual_gc_eval: true\nempty_unused_memory_level: 0\nprofile: false\n"
        "profile_step_start: 10\nprofile_step_end: 12\nprofile_ranks: [0]\n"
        "logging_level: null\ndeterministic_mode: false\nuse_cpu_initialization: null\n"
        "log_straggler: false\nstraggler_ctrlr_port: 65535\nstraggler_minmax_count: 1\n"
        "enable_one_logger: true\none_logger_project: megatron-lm\n"
        "app_tag_run_version: 0.0.0\nenable_ft_package: false\nft_num_warmup_iters: 5\n"
    ),
    "megatron_wrap/flow/__confignest_manifest__": "selection_mode: one\n",
    "megatron_wrap/flow/gpt_sft.yaml": (
        "flow_key: gpt_sft\nflow_type: training\ncompatiable_model_type: GPT\n"
        "log_each_step_metrics: false\ncollate_type: fixed_length\n"
    ),
    "megatron_wrap/init.yaml": "megatron_lm_project_path: null\nskip_compile_dependencies: true\n",
    "megatron_wrap/logger.yaml": (
        "patch_print: false\nremove_logging: true\nadd_memory_to_metrics: true\n"
        "enable_wandb: false\nwandb_entity: null\nwandb_project: null\nwandb_name: null\n"
        "wandb_dir: null\n"
    ),
    "megatron_wrap/model_provider/__confignest_manifest__": "selection_mode: one\n",
    "megatron_wrap/model_provider/gpt.yaml": "model_type: GPT\nparallel_output: false\n",
}

VIEW = """\
megatron_lm:
  model:
    arch:
      __select__: tiny-llama
    parallel:
      __select__: plain
      __override__:
        context_parallel_size: 1
  train:
    common:
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 3
      save_interval: 2
    learning-rate:
      lr: 1.0e-3
megatron_wrap:
  logger:
    patch_print: false
  model_provider:
    __select__: gpt
  flow:
    __select__: gpt_sft
"""


def write_nest(root: Path, view: str = VIEW, files: dict[str, str] | None = None) -> Path:
    """Writes `<root>/configs/nest/...` and `<root>/configs/run.yaml`; returns the view path."""
    for name, text in {**NEST_FILES, **(files or {})}.items():
        path = root / "configs" / "nest" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    view_path = root / "configs" / "run.yaml"
    view_path.write_text(view)
    return view_path
