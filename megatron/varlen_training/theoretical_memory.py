"""Megatron-LM's theoretical memory footprint line, from the run's typed configs.

Megatron-LM (core_v0.16.1 ``theoretical_memory_usage.py``, called by ``training_log`` on global
rank 0 with each memory report: the first iteration lines, until one after the run's second
iteration) prints the parameter counts, which activation formula it uses, and::

    Theoretical memory footprints: weight and optimizer=12.34 MB, activation=5.67 MB, total=18.01 MB

(each line through the rank-prefixed log; Megatron-LM's ``print`` of the last one adds an empty
line, left out here).

The same formulas here (written from its facts, not its code), in float64 as Python computes
them:

- weights and optimizer: the parameters of the most loaded model shard (the first pipeline
  stage's share of the transformer block, the whole MTP block and one embedding, over TP; the
  output layer too when untied without PP) times 18 bytes (fp32 main weights and Adam moments,
  16-bit weights and gradients), or ``6 + 12 / data-parallel size`` bytes with the distributed
  optimizer. Per layer: attention ``2 h^2 (1 + groups / heads) (kv_channels heads / h)``, the MLP
  ``2 h ffn`` (x 3/2 with SwiGLU; routed experts and the shared expert likewise in MoE layers),
  norms ``2 h`` (RMSNorm) or ``4 h`` (LayerNorm's bias); the MTP layers are MoE layers when the
  last decoder layer is. Biases and learned position embeddings are not counted, as there.
- activations: with sequence parallel and ``--recompute-granularity selective``, Table 2 of
  Korthikanti et al. (``s b h (18 + 4 ffn / h)`` per layer, embeddings, the output layer and
  the loss), over TP; otherwise the "without SP" estimate (``s b h (10 + 24 / tp)`` per layer,
  logits, 5 % overhead). Both scale by the pipeline's micro-batches in flight.

For packed micro-batches: the activation part is Megatron-LM's for ``--seq-length`` x
``--micro-batch-size`` tokens per micro-batch, context parallelism not counted (as there). A
packed micro-batch here holds up to ``--max-seqlen-per-dp-cp-rank`` tokens per rank, however
many sequences, so the figure is a planning number for a full fixed-length micro-batch, not a
bound on a packed one. Hybrid (Mamba) models print Megatron-LM's "not yet supported" line. With
``--multi-latent-attention`` the attention term is Megatron-LM's MLA one (query and key/value
latents with their norms, the shared rotated key, the output projection). Megatron-LM main has
since changed the rest of the formula (latent MoE, active parameters): this follows core_v0.16.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron.varlen_training.config import ModelConfig, RunConfig
from megatron.varlen_training.log import print_rank_0

BYTES_PER_MEGABYTE = 1024 * 1024
# Bytes per parameter (Megatron-LM's count): the 16-bit weight (2) and the fp32 gradient (4) on
# every rank, plus the optimizer's fp32 main weight and Adam's two moments (12), which the
# distributed optimizer shards over the data-parallel ranks.
UNSHARDED_BYTES_PER_PARAMETER = 6
SHARDED_OPTIMIZER_BYTES_PER_PARAMETER = 12
BYTES_PER_PARAMETER = UNSHARDED_BYTES_PER_PARAMETER + SHARDED_OPTIMIZER_BYTES_PER_PARAMETER
SWIGLU_MULTIPLIER = 3 / 2  # a gated MLP's third projection, relative to two
# Activation bytes per token and hidden unit of one layer (Korthikanti et al., Table 2, with
# sequence parallel and selective recompute), and of the "without SP" estimate.
LAYER_ACTIVATION_BYTES, LAYER_FFN_ACTIVATION_BYTES = 18, 4
NO_SP_ACTIVATION_BYTES, NO_SP_TP_SPLIT_ACTIVATION_BYTES = 10, 24
EMBEDDING_INPUT_BYTES = 8  # the input token ids (int64) per token and micro-batch in flight
OUTPUT_LAYER_BYTES = 4  # fp32 inputs of the output layer and the cross entropy
NO_SP_OVERHEAD = 1.05  # the optimizer's and other temporaries (Megatron-LM's 5 %)
BYTES_PER_LOGIT = 2  # 16-bit logits and final-norm outputs in the "without SP" estimate
HYBRID_LINE = ("Theoretical memory footprints not yet supported for hybrid Mamba-Transformer "
               "models.")


@dataclass(frozen=True)
class MemoryFootprint:
    """The three numbers of the footprint line, in MB (MiB, as Megatron-LM's)."""

    weight_and_optimizer_mb: float
    activation_mb: float

    @property
    def total_mb(self) -> float:
        return self.weight_and_optimizer_mb + self.activation_mb

    def line(self) -> str:
        return (f"Theoretical memory footprints: weight and optimizer="
                f"{self.weight_and_optimizer_mb:.2f} MB, activation={self.activation_mb:.2f} MB, "
                f"total={self.total_mb:.2f} MB")


def _moe_layer_pattern(model: ModelConfig) -> list[int]:
    """1 per MoE decoder layer, 0 per dense one (``--moe-layer-freq``: every N-th, or a list)."""
    if model.moe is None:
        return [0] * model.num_layers
    freq = model.moe.moe_layer_freq
    if isinstance(freq, int):
        return [int(i % freq == 0) for i in range(model.num_layers)]
    return list(freq)


def _attention_parameters(model: ModelConfig, norms: int) -> float:
    """One layer's attention: Megatron-LM's MLA term (latent projections with their norms, the
    shared rotated key, the output projection) or ``2 h^2 (1 + groups / heads) (q width / h)``."""
    h, heads = model.hidden_size, model.num_attention_heads
    mla = model.mla
    if mla is not None:
        query = (h * heads * mla.q_head_dim if mla.q_lora_rank is None else
                 mla.q_lora_rank * (h + heads * mla.q_head_dim + norms))
        latent = mla.kv_lora_rank * (h + heads * (mla.qk_head_dim + mla.v_head_dim) + norms)
        return query + latent + h * mla.qk_pos_emb_head_dim + heads * mla.v_head_dim * h
    groups = model.num_query_groups if model.group_query_attention else heads
    query_ratio = model.head_dim * heads / h
    return 2 * h * h * (1 + groups / heads) * query_ratio


def _layer_parameters(model: ModelConfig) -> tuple[float, float]:
    """(a dense layer's, an MoE layer's) counted parameters."""
    h = model.hidden_size
    norms = 1 if model.normalization == "RMSNorm" else 2
    attention = _attention_parameters(model, norms)
    glu = SWIGLU_MULTIPLIER if model.gated_mlp else 1
    dense = 2 * h * (model.ffn_hidden_size * glu + norms) + attention
    if model.moe is None:
        return dense, 2 * h * norms + attention
    moe = model.moe
    expert_ffn = moe.moe_ffn_hidden_size or model.ffn_hidden_size
    shared_ffn = moe.moe_shared_expert_intermediate_size or 0
    routed = expert_ffn * moe.num_experts * glu
    return dense, 2 * h * (routed + shared_ffn * glu + norms) + attention


@dataclass(frozen=True)
class ParameterCounts:
    """Megatron-LM's parameter counts (floats, as its formula)."""

    transformer_block: float
    mtp_block: float
    embedding_layers: float
    embedding: float  # one word embedding (h x padded vocabulary)

    @property
    def total(self) -> float:
        return self.transformer_block + self.mtp_block + self.embedding_layers


def parameter_counts(model: ModelConfig) -> ParameterCounts:
    """The transformer block (with the final norm), MTP block and embedding parameters."""
    dense, moe = _layer_parameters(model)
    pattern = _moe_layer_pattern(model)
    num_moe = sum(pattern)
    norms = 1 if model.normalization == "RMSNorm" else 2
    block = dense * (model.num_layers - num_moe) + moe * num_moe + norms * model.hidden_size
    mtp_layers = model.mtp_num_layers or 0
    mtp = (moe if pattern[-1] else dense) * mtp_layers  # MTP layers are like the last layer
    embedding = model.hidden_size * model.padded_vocab_size
    embeddings = embedding * (2 if model.untie_embeddings_and_output_weights else 1)
    return ParameterCounts(block, mtp, embeddings, embedding)


def _billions(count: float) -> float:
    return count / 10**9


def weight_and_optimizer_bytes(run: RunConfig, lines: list[str]) -> float:
    """Bytes of weights, gradients and optimizer state of the most loaded shard; appends
    Megatron-LM's verbose lines about the counts to ``lines``."""
    model, parallel = run.model, run.parallel
    counts = parameter_counts(model)
    tp, pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
    lines.append("Number of parameters in transformer block in billions: "
                 f"{_billions(counts.transformer_block): .2f}")
    if model.mtp_num_layers is not None:
        lines.append(f"Number of parameters in mtp block in billions: "
                     f"{_billions(counts.mtp_block): .2f}")
    lines.append(f"Number of parameters in embedding layers in billions: "
                 f"{_billions(counts.embedding_layers):.2f}")
    lines.append(f"Total number of parameters in billions: {_billions(counts.total):.2f}")
    most_loaded = (counts.transformer_block / pp + counts.mtp_block + counts.embedding) / tp
    if model.untie_embeddings_and_output_weights and pp == 1:
        most_loaded += counts.embedding / tp  # the output layer sits on the same stage
    lines.append(f"Number of parameters in most loaded shard in billions: "
                 f"{_billions(most_loaded):.4f}")
    if pp > 1:
        lines.append(f"Number of parameters in other shards in billions: "
                     f"{_billions(counts.transformer_block / (pp * tp)):.4f}")
    per_parameter = (UNSHARDED_BYTES_PER_PARAMETER
                     + SHARDED_OPTIMIZER_BYTES_PER_PARAMETER / parallel.data_parallel_size
                     if run.optimizer.use_distributed_optimizer else BYTES_PER_PARAMETER)
    return most_loaded * per_parameter


def _in_flight_factor(run: RunConfig, num_microbatches: int, lines: list[str]) -> float:
    """The pipeline schedule's factor on the first stage's activations (1 without PP)."""
    pp = run.parallel.pipeline_model_parallel_size
    vpp = run.parallel.virtual_pipeline_model_parallel_size
    if vpp is not None:
        penalty = 1 + (pp - 1) / (pp * vpp)
        lines.append(f"Memory penalty from interleaved schedule: {penalty:.2f}")
        lines.append(f"Number of in-flight microbatches: {math.ceil(penalty * pp)}")
        return penalty
    if pp > 1:
        lines.append(f"Number of in-flight microbatches: {min(num_microbatches, pp)}")
        return min(1, num_microbatches / pp)
    return 1.0


def _embedding_activations(run: RunConfig, tokens: int) -> float:
    """The embedding's input ids and dropout output, for ``pp`` micro-batches in flight."""
    pp = run.parallel.pipeline_model_parallel_size
    return EMBEDDING_INPUT_BYTES * tokens * pp + tokens * run.model.hidden_size * pp


def activation_bytes(run: RunConfig, num_microbatches: int, lines: list[str]) -> float:
    """Megatron-LM's activation estimate of the first pipeline stage (module docstring)."""
    model, parallel = run.model, run.parallel
    tp, h = parallel.tensor_model_parallel_size, model.hidden_size
    tokens = model.seq_length * run.training.micro_batch_size
    with_sp = parallel.sequence_parallel and model.recompute_granularity == "selective"
    lines.append("compute_activation_memory with SP" if with_sp
                 else "compute_activation_memory_without_sp")
    if with_sp:
        layer = tokens * h * (LAYER_ACTIVATION_BYTES
                              + LAYER_FFN_ACTIVATION_BYTES * model.ffn_hidden_size / h)
        lines.append(f"Activation memory footprint per transformer layer: "
                     f"{layer / BYTES_PER_MEGABYTE / tp:.1f} MB")
    else:
        layer = tokens * h * (NO_SP_ACTIVATION_BYTES + NO_SP_TP_SPLIT_ACTIVATION_BYTES / tp)
        lines.append(f"Activation memory footprint per transformer layer (precise, without "
                     f"SP): {layer / BYTES_PER_MEGABYTE:.1f} MB")
    total = layer * model.num_layers + _embedding_activations(run, tokens)
    total *= _in_flight_factor(run, num_microbatches, lines)
    if parallel.pipeline_model_parallel_size == 1 and with_sp:
        total += tokens * h * OUTPUT_LAYER_BYTES * (1 + model.padded_vocab_size / h)
    elif parallel.pipeline_model_parallel_size == 1:
        total += (tokens * model.padded_vocab_size / tp + tokens * h) * BYTES_PER_LOGIT
    return total / tp if with_sp else total * NO_SP_OVERHEAD


def theoretical_memory_lines(run: RunConfig) -> list[str]:
    """The lines Megatron-LM prints with its verbose footprint report, the footprint last."""
    if run.model.hybrid is not None:
        return [HYBRID_LINE]
    lines: list[str] = []
    weights = weight_and_optimizer_bytes(run, lines)
    activations = activation_bytes(run, run.training.num_microbatches, lines)
    footprint = MemoryFootprint(weights / BYTES_PER_MEGABYTE, activations / BYTES_PER_MEGABYTE)
    return lines + [footprint.line()]


def report_theoretical_memory(run: RunConfig) -> None:
    """Prints :func:`theoretical_memory_lines` on global rank 0."""
    for line in theoretical_memory_lines(run):
        print_rank_0(line)
