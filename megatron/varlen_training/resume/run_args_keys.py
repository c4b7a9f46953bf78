"""The keys a checkpoint's ``run_args.json`` records, grouped by what a resume does with them.

Model shape and data order must match (:mod:`~megatron.varlen_training.resume.consistency`);
the optimizer layout keys say which layouts the optimizer state follows
(:mod:`~megatron.varlen_training.resume.optimizer_layout_check`); the context keys only serve the
messages; the ``--use-checkpoint-args`` keys are taken, not compared
(:mod:`~megatron.varlen_training.checkpoint_model_flags`). Keys are the flags' dests, which are
also the names of the config fields recorded. No megatron-core and no run config here.
"""

from __future__ import annotations

RUN_ARGS_FILENAME = "run_args.json"
LEARNED_POSITIONS = "learned_absolute"  # the one position encoding with a table of weights
# Keys are the flags' dests, which are also the names of the config fields recorded.
HYBRID_KEYS = ("hybrid_override_pattern", "hybrid_attention_ratio", "hybrid_mlp_ratio",
                "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")
# MoE model shape (moe_arguments.py): a dense run records None, so it never matches an MoE one.
MOE_KEYS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
             "moe_shared_expert_intermediate_size", "moe_layer_freq")
# Megatron-LM's partial / interpolated RoPE (model_arguments.py) and their values before.
ROPE_KEYS = {"rotary_percent": 1.0, "rotary_seq_len_interpolation_factor": None,
             "no_rope_freq": None}
NORM_KEYS = {"layernorm_zero_centered_gamma": False}
# The MLP's activation flags (recorded since each was honoured; the value checkpoints had before).
ACTIVATION_KEYS = {"squared_relu": False, "quick_geglu": False, "glu_linear_offset": 0.0,
                   "activation_func_clamp_value": None}
# --window-size / --window-attn-skip-freq (recorded since they were honoured): a resume keeps
# them; --finetune may change them (the weights do not depend on the window).
WINDOW_KEYS = {"window_size": None, "window_attn_skip_freq": None}
# --softmax-type: an attention sink per row (learnable: a parameter of each attention layer).
SOFTMAX_KEYS = {"softmax_type": "vanilla"}
# Multi-latent attention's shape and RoPE (mla_arguments.py); checkpoints from before had none.
MLA_KEYS = {"multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": None,
             "qk_head_dim": None, "qk_pos_emb_head_dim": None, "v_head_dim": None,
             "rope_type": None, "rotary_scaling_factor": None, "mscale": None,
             "mscale_all_dim": None}
# Keys recorded under a dest that is not their flag's name (Megatron-LM's dests).
FLAG_OF_KEY = {"layernorm_zero_centered_gamma": "--apply-layernorm-1p"}
MODEL_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "max_position_embeddings", "position_embedding_type", "rotary_base", "normalization",
    "swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights", "mtp_num_layers",
    "padded_vocab_size", "vocab_size", "tokenizer_type", "bf16", "fp16",
    # Hugging Face families (--hf-checkpoint) and hybrid models (pretrain_mamba.py): a GPT run
    # records None for the hybrid keys, so a GPT checkpoint never matches a hybrid run.
    "kv_channels", "norm_epsilon", "add_qkv_bias", "qk_layernorm", "use_rope_scaling",
    "rope_scaling_factor", *HYBRID_KEYS, *MOE_KEYS,
    # Megatron-LM's RoPE flags (model_arguments.py).
    *ROPE_KEYS,
    # --apply-layernorm-1p: the norm weights mean gamma - 1 instead of gamma.
    *NORM_KEYS,
    # --squared-relu, --quick-geglu and the gated MLP's offset and clamp: the MLP's activation.
    *ACTIVATION_KEYS,
    # --multi-latent-attention: a standard run records False and None for the rest.
    *MLA_KEYS,
    # sliding-window attention: which keys each layer's queries see.
    *WINDOW_KEYS,
    *SOFTMAX_KEYS,
)
INDEXED_SAMPLES_KEY = "indexed_train_samples"  # training samples indexed data was built for
# Where SFT records keep their text (the dataset and megatron.wrap's gpt_sft flow read them):
# another key reads other fields of the same records.
SFT_KEYS = {"sft_messages_key": "messages", "sft_prompt_key": "prompt",
            "sft_response_key": "response"}
# How a real SFT file's samples were split into training and validation: by --split's shares,
# or the last 5% validate (the only rule before --sft honoured --split: a checkpoint without
# this key that trained on an SFT file used it, whatever --split it recorded). None: no SFT file.
SFT_SPLIT_RULE_KEY = "sft_split_rule"
SFT_SPLIT_BY_SHARES, SFT_SPLIT_TAIL = "split", "tail"
# --rampup-batch-size and its rounding decide which samples each iteration reads.
RAMPUP_KEY = "rampup_batch_size"  # the ramp itself (None: no ramp-up)
RAMPUP_KEYS = {RAMPUP_KEY: None, "decrease_batch_size_if_needed": False}
# --packing-unit document: the longest piece a document was cut into (--document-piece-length,
# else the longest sequence the layout runs: --max-seqlen-per-dp-cp-rank x the largest CP group,
# learned positions' table). Other pieces are permuted and read as another stream. None: other
# data.
DOCUMENT_PIECE_KEY = "document_piece_length"
# --global-batch-size: compared only with a ramp-up (whose sizes it sets); without, a resume
# may change it and continues at the checkpoint's samples (resumed_batch_anchor.py).
GLOBAL_BATCH_KEY = "global_batch_size"
DATA_ORDER_KEYS = ("seed", GLOBAL_BATCH_KEY, "sft_mock_dataset_config_json", "split",
                   INDEXED_SAMPLES_KEY, "packing_unit", *SFT_KEYS, SFT_SPLIT_RULE_KEY,
                   *RAMPUP_KEYS, DOCUMENT_PIECE_KEY)
# Data-order keys compared only where the checkpoint recorded them: a document run saved before
# the key's pieces are unknown (they followed that run's layout).
CHECKED_WHEN_RECORDED = (DOCUMENT_PIECE_KEY,)
# A data-order change --override-data-fingerprint accepts (the stream continues, changed, from
# the saved position) where both sides have a value.
OVERRIDABLE_DATA_KEYS = (INDEXED_SAMPLES_KEY, DOCUMENT_PIECE_KEY)
# Keys added after checkpoints were written without them: the value those checkpoints had.
RECORDED_BEFORE = {"packing_unit": "sample", **SFT_KEYS, **ROPE_KEYS, **NORM_KEYS,
                   **ACTIVATION_KEYS, **MLA_KEYS, **RAMPUP_KEYS, **WINDOW_KEYS,
                   **SOFTMAX_KEYS}
DATA_POSITION_KEY = "consumed_train_samples"  # samples read when the checkpoint was saved
# Validation samples the run's evaluations had read (Megatron-LM's ``consumed_valid_samples``):
# the resumed run's next evaluation continues the validation stream there.
VALID_POSITION_KEY = "consumed_valid_samples"
OPTIMIZER_LAYOUT_KEY = "use_distributed_optimizer"
# With expert parallelism megatron-core keeps the experts' optimizer state in an optimizer of
# its own (a chained optimizer): EP 1 and EP > 1 checkpoints have different optimizer layouts.
EXPERT_PARALLEL_KEY = "expert_model_parallel_size"
EXPERT_TENSOR_PARALLEL_KEY = "expert_tensor_parallel_size"  # None: a dense model (no experts)
PIPELINE_PARALLEL_KEY = "pipeline_model_parallel_size"
VIRTUAL_PIPELINE_KEY = "num_layers_per_virtual_pipeline_stage"  # None: no virtual stages
# Megatron-LM's pipeline split flags (pipeline_arguments.py): which layers each stage holds.
PIPELINE_SPLIT_KEYS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                       "account_for_embedding_in_pipeline_split",
                       "account_for_loss_in_pipeline_split", "num_virtual_stages_per_pipeline_rank",
                       "pipeline_model_parallel_layout")
# The layout the flags above resolve to (pipeline_layout.py: megatron-core's placement), which the
# distributed optimizer's buffers follow: ``[pp_rank][vp_stage]`` decoder layers of each model
# chunk, and the virtual pipeline size (None: one chunk per rank). Equivalent spellings (the two
# virtual pipeline flags, none for one virtual stage per rank, a layout string or first/last
# sizes) record the same; a checkpoint saved before the key gets it from its recorded flags.
PIPELINE_CHUNKS_KEY = "pipeline_chunk_layers"
VIRTUAL_PIPELINE_SIZE_KEY = "virtual_pipeline_model_parallel_size"
# The flags that give that layout (with --num-layers and the PP size): named in messages.
PIPELINE_LAYOUT_FLAG_KEYS = (VIRTUAL_PIPELINE_KEY, *PIPELINE_SPLIT_KEYS)
# The sizes --use-distributed-optimizer's state (megatron-core's dp_reshardable format: one shard
# per data-parallel group of buffers) cannot change: only data parallelism reshards it.
SHARDED_OPTIMIZER_SIZES = {"tensor_model_parallel_size": "--tensor-model-parallel-size",
                           PIPELINE_PARALLEL_KEY: "--pipeline-model-parallel-size",
                           EXPERT_PARALLEL_KEY: "--expert-model-parallel-size",
                           EXPERT_TENSOR_PARALLEL_KEY: "--expert-tensor-parallel-size",
                           VIRTUAL_PIPELINE_KEY: "--num-layers-per-virtual-pipeline-stage",
                           **{key: "--" + key.replace("_", "-") for key in PIPELINE_SPLIT_KEYS}}
# --decoupled-lr gives the embedding and output weights an optimizer param group of their own:
# with and without it the optimizer states differ in layout; the pair's values are the bounds
# of that group's schedule, which its state carries (training.load_state). Checkpoints from
# before these keys had no decoupled LR (the flag did not exist): missing means None.
DECOUPLED_LR_FLAGS = {"decoupled_lr": "--decoupled-lr", "decoupled_min_lr": "--decoupled-min-lr"}
DATA_SOURCES_KEY = "data_sources"  # one fingerprint per --data-path entry (data_fingerprint)
# Recorded for messages, not compared: the padded vocabulary's inputs (it is derived, not a
# flag), --seq-length (which --max-position-embeddings follows unless given) and --data-path
# as spelled (the fingerprints are compared).
CONTEXT_KEYS = ("make_vocab_size_divisible_by", "tensor_model_parallel_size", "seq_length",
                 "data_path", "data_entries")
# Recorded for --use-checkpoint-args (checkpoint_model_flags.py: what Megatron-LM's
# load_args_from_checkpoint takes besides the model shape), not compared: a resume may change
# the dropouts or the tokenizer file's location. MoE router keys are None for a dense run.
# --tiktoken-num-special-tokens (which Megatron-LM does not take) goes with --tiktoken-pattern:
# both decide which id a TikTokenizer gives each token.
CHECKPOINT_ARGS_KEYS = ("hidden_dropout", "attention_dropout", "apply_query_key_layer_scaling",
                        "tokenizer_model", "tiktoken_pattern", "tiktoken_num_special_tokens",
                        "spec")
MOE_ROUTER_KEYS = ("moe_router_pre_softmax", "moe_router_score_function",
                   "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor")
# --moe-token-dispatcher-type as the run chose it: None where it was left to the default
# (moe_arguments.default_dispatcher), so that another run's packing picks its own; None for
# a dense run.
MOE_DISPATCHER_KEY = "moe_token_dispatcher_type"
