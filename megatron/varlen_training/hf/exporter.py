"""Write our GPT model as a Hugging Face checkpoint directory that ``transformers`` loads.

Each pipeline stage writes its own safetensors shard: the stage's TP ranks gather each
parameter over TP (routed experts over expert TP and expert parallelism), and TP rank 0 of the
first data/context-parallel replica converts the full tensors to HF names and writes them.
Global rank 0 then writes ``config.json``, the shard index (with PP > 1) and
``generation_config.json``, and removes the weight files an earlier export in another layout
left. No rank holds more than one stage.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import tempfile

import torch

from megatron.core import parallel_state
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import (
    UserInputError, agree_and_gather, agree_on_errors, one_line, share_result,
)
from megatron.varlen_training.hf import weights
from megatron.varlen_training.hf.config import (
    HFModelConfig, config_from_model, load_hf_config, to_config_json, token_ids,
)
from megatron.varlen_training.hf.importer import mapped_tensors
from megatron.varlen_training.hf.safetensors_io import (
    INDEX_FILE, SHARD_FORMAT, SINGLE_FILE, stale_weight_files, write_index, write_shard,
)
from megatron.varlen_training.layout_invariant_init import (
    canonical_parameter_name, is_expert_parameter, stores_gamma_minus_one,
)
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.model import unwrap
from megatron.varlen_training.megatron_lm_tokenizers import (
    GPT2_BPE_TYPE, gpt2_eod_id, save_gpt2_bpe,
)
from megatron.varlen_training.model_file_tokenizers import MODEL_FILE_TYPES
from megatron.varlen_training.tokenizer import HF_TOKENIZER_TYPE, build_run_tokenizer

GENERATION_CONFIG_FILENAME = "generation_config.json"
# A Hugging Face tokenizer directory's files (fast and slow tokenizers, chat template).
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "chat_template")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "added_tokens.json")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_TIED_OUTPUT = "output_layer.weight"
EXPORT_HINT = "choose a writable directory: --save-hf, or MegatronWrap.save_pretrained's out_dir"
_EXPERT_INDEX = re.compile(r"(experts\.local_experts\.)(\d+)\.")


def expected_hf_names(config: HFModelConfig) -> set[str]:
    """Every tensor name a checkpoint of this architecture holds."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config.tied_embeddings:
        names.add("lm_head.weight")
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight",
                 "self_attn.o_proj.weight"] + _attention_names(config)
    for layer in range(config.num_layers):
        names.update(f"model.layers.{layer}.{suffix}" for suffix in per_layer + _mlp_names(
            config, layer))
    return names


def _attention_names(config: HFModelConfig) -> list[str]:
    """The attention tensors of one layer besides o_proj: fused-QKV families, or MLA's."""
    if config.mla is not None:
        names = ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight"]
        names += (["q_proj.weight"] if config.mla.q_lora_rank is None else
                  ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"])
        return [f"self_attn.{name}" for name in names]
    names = [f"self_attn.{p}_proj.weight" for p in "qkv"]
    if config.qkv_bias:
        names += [f"self_attn.{p}_proj.bias" for p in "qkv"]
    if config.qk_layernorm:
        names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    return names


def _mlp_names(config: HFModelConfig, layer: int) -> list[str]:
    """The MLP tensors of one layer: dense, or the router and experts (DeepSeek-V3: also the
    router's bias and the shared experts)."""
    dense = ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    moe = config.moe
    if moe is None or not moe.layer_freq[layer]:
        return [f"mlp.{name}" for name in dense]
    names = ["mlp.gate.weight"] + [f"mlp.experts.{e}.{name}" for e in range(moe.num_experts)
                                   for name in dense]
    if moe.expert_bias:
        names.append("mlp.gate.e_score_correction_bias")
    if moe.shared_ffn_hidden_size:
        names += [f"mlp.shared_experts.{name}" for name in dense]
    return names


def _gather(tensor: torch.Tensor, group) -> list[torch.Tensor]:
    """``tensor`` of every rank of ``group``, in rank order."""
    size = torch.distributed.get_world_size(group)
    if size == 1:
        return [tensor]
    shards = [torch.empty_like(tensor) for _ in range(size)]
    torch.distributed.all_gather(shards, tensor.contiguous(), group=group)
    return shards


def _expert_tensors(canonical: str, param: torch.Tensor, config: HFModelConfig) -> dict:
    """A routed expert parameter of EVERY expert-parallel rank (gathered over expert TP, then
    EP): rank r holds the experts r * local .. (r + 1) * local - 1."""
    shards = _gather(param, parallel_state.get_expert_tensor_parallel_group())
    per_rank = [_gather(shard, parallel_state.get_expert_model_parallel_group())
                for shard in shards]
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    local = config.moe.num_experts // ep_size
    tensors = {}
    for rank in range(ep_size):
        rule, names = weights.match(_shift_expert(canonical, (rank - ep_rank) * local),
                                    mla=config.mla is not None)
        tensors.update(weights.hf_tensors(
            rule, names, [ranks[rank].detach().cpu() for ranks in per_rank], config))
    return tensors


def _shift_expert(canonical: str, offset: int) -> str:
    """``canonical`` with its global expert index moved by ``offset``."""
    return _EXPERT_INDEX.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}.", canonical)


@torch.no_grad()
def stage_tensors(chunks: list[torch.nn.Module], config: HFModelConfig) -> dict[str, torch.Tensor]:
    """This stage's parameters as full HF tensors (on every TP rank of the stage; every rank of
    the stage calls it: routed experts are gathered over expert parallelism, which spans data
    parallel replicas)."""
    tensors: dict[str, torch.Tensor] = {}
    tp_group = parallel_state.get_tensor_model_parallel_group()
    for chunk in chunks:
        for name, param in mapped_tensors(chunk):
            if config.tied_embeddings and name == _TIED_OUTPUT:
                continue  # the first stage writes the word embedding it mirrors
            canonical = canonical_parameter_name(chunk, name, config.tied_embeddings)
            if is_expert_parameter(name):
                tensors.update(_expert_tensors(canonical, param.detach(), config))
                continue
            rule, names = weights.match(canonical, mla=config.mla is not None)
            shards = [s.detach().cpu() for s in _gather(param.detach(), tp_group)]
            tensors.update(weights.hf_tensors(rule, names, shards, config,
                                              stores_gamma_minus_one(chunk, name)))
    return tensors


def _is_first_replica() -> bool:
    return parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0


def _write_generation_config(out_dir: str, config: HFModelConfig, source: str | None) -> None:
    """The source checkpoint's ``generation_config.json`` (its text, sampling settings
    included), else one with the token ids; with neither, an earlier export's file goes (its
    ids and settings would be another model's)."""
    path = os.path.join(out_dir, GENERATION_CONFIG_FILENAME)
    generation = token_ids(config)
    if source is None and not generation:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path, "w", encoding="utf-8") as handle:
        if source is not None:
            handle.write(source)
        else:
            json.dump(generation, handle, indent=2)


def _write_metadata(out_dir: str, config: HFModelConfig, weight_map: dict[str, str],
                    total_bytes: int, dtype: torch.dtype, generation: str | None) -> None:
    missing = expected_hf_names(config) - set(weight_map)
    if missing:
        raise RuntimeError(f"export wrote no tensor {sorted(missing)[0]!r} "
                           f"({len(missing)} missing)")
    if len(set(weight_map.values())) > 1:
        write_index(out_dir, weight_map, total_bytes)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(to_config_json(config, _DTYPE_NAMES[dtype]), handle, indent=2)
    _write_generation_config(out_dir, config, generation)


def _on_disk(write, out_dir: str, *args, **kwargs):
    """``write(*args, **kwargs)``; an I/O error is a one-line user error naming ``out_dir``."""
    try:
        return write(*args, **kwargs)
    except OSError as err:
        raise UserInputError(f"cannot write the Hugging Face checkpoint to {out_dir!r}: "
                             f"{one_line(err)} ({EXPORT_HINT})") from err


def _make_out_dir(out_dir: str) -> None:
    if torch.distributed.get_rank() == 0:
        _on_disk(os.makedirs, out_dir, out_dir, exist_ok=True)


def _write_stage(out_dir: str, filename: str, tensors: dict) -> tuple[dict[str, str], int]:
    """This stage's shard, written by TP rank 0 of the first replica; ``(part, bytes)``."""
    if not (_is_first_replica() and parallel_state.get_tensor_model_parallel_rank() == 0):
        return {}, 0
    _on_disk(write_shard, out_dir, os.path.join(out_dir, filename), tensors)
    return ({name: filename for name in tensors},
            sum(t.numel() * t.element_size() for t in tensors.values()))


def _write_rank_0_files(out_dir: str, config: HFModelConfig, parts: list,
                        dtype: torch.dtype, generation: str | None) -> None:
    if torch.distributed.get_rank() != 0:
        return
    weight_map = {name: f for names, _ in parts for name, f in names.items()}
    _on_disk(_write_metadata, out_dir, out_dir, config, weight_map, sum(b for _, b in parts),
             dtype, generation)
    written = set(weight_map.values())
    if len(written) > 1:
        written.add(INDEX_FILE)
    for name in stale_weight_files(out_dir, written):  # an earlier export's, another layout
        _on_disk(os.remove, out_dir, os.path.join(out_dir, name))


def export_hf(chunks: list[torch.nn.Module], out_dir: str, config: HFModelConfig,
              generation: str | None = None) -> str:
    """Writes the model (this rank's unwrapped chunks, all ranks calling) to ``out_dir``;
    ``generation``: the text of the source checkpoint's ``generation_config.json``, if any.

    Each write ends in :func:`agree_on_errors` instead of a barrier: a rank that cannot write
    (a read-only or full disk) stops every rank in one line instead of leaving them waiting.

    Returns:
        ``out_dir``.
    """
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    filename = SINGLE_FILE if pp_size == 1 else SHARD_FORMAT.format(pp_rank + 1, pp_size)
    dtype = next(chunks[0].parameters()).dtype
    agree_on_errors(_make_out_dir, out_dir)
    tensors = stage_tensors(chunks, config)
    _, parts = agree_and_gather(functools.partial(_write_stage, out_dir, filename, tensors),
                                share_result)  # every rank's (part, bytes), in the same exchange
    agree_on_errors(_write_rank_0_files, out_dir, config, parts, dtype, generation)
    return out_dir


def export_config(run: RunConfig) -> HFModelConfig:
    """The architecture to export for a run, with the special token ids of the checkpoint it
    started from (``--hf-checkpoint``), else of its tokenizer (Hugging Face, GPT-2 BPE, a
    SentencePiece or TikToken model): without them ``generate`` would never stop at the end of
    a turn. A DeepSeek-V3 run keeps its checkpoint's layout of the rotated channels
    (``rope_interleave``), so an export holds the tensors it was imported from."""
    config = config_from_model(run.model)
    if run.checkpoint.hf_checkpoint:
        source = load_hf_config(run.checkpoint.hf_checkpoint)
        if config.mla is not None and source.mla is not None:
            config = dataclasses.replace(config, mla=dataclasses.replace(
                config.mla, rope_interleave=source.mla.rope_interleave))
        return dataclasses.replace(config, bos_token_id=source.bos_token_id,
                                   eos_token_id=source.eos_token_id,
                                   pad_token_id=source.pad_token_id)
    if run.data.tokenizer_type == HF_TOKENIZER_TYPE:
        return dataclasses.replace(config, **_tokenizer_token_ids(run.data.tokenizer_model))
    if run.data.tokenizer_type == GPT2_BPE_TYPE:  # GPT-2's: bos = eos = <|endoftext|>, no pad
        eod = gpt2_eod_id(run.data.vocab_file)
        return dataclasses.replace(config, bos_token_id=eod, eos_token_id=eod, pad_token_id=None)
    if run.data.tokenizer_type in MODEL_FILE_TYPES:  # the SentencePiece / TikToken model's own
        tokenizer = build_run_tokenizer(run.data, run.model.vocab_size)
        return dataclasses.replace(config, **tokenizer.hf_token_ids())
    return config


def _tokenizer_token_ids(tokenizer_dir: str) -> dict:
    """``bos``/``eos``/``pad_token_id`` of the Hugging Face tokenizer in ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def _copy_file(source_dir: str, name: str, out_dir: str) -> None:
    """``source_dir/name`` to ``out_dir/name``; nothing when both are the same file (an export
    written over the directory it came from)."""
    source, target = os.path.join(source_dir, name), os.path.join(out_dir, name)
    if not (os.path.exists(target) and os.path.samefile(source, target)):
        shutil.copyfile(source, target)


def _tokenizer_files(directory: str) -> list[str]:
    """The names of the Hugging Face tokenizer files in ``directory``."""
    return [name for name in sorted(os.listdir(directory))
            if (name.startswith(TOKENIZER_FILE_PREFIXES) or name in TOKENIZER_FILES)
            and os.path.isfile(os.path.join(directory, name))]


def copy_tokenizer_files(tokenizer_dir: str, out_dir: str) -> list[str]:
    """Copies a Hugging Face tokenizer's files next to the exported model; their names."""
    copied = _tokenizer_files(tokenizer_dir)
    for name in copied:
        _copy_file(tokenizer_dir, name, out_dir)
    return copied


def replace_tokenizer_files(tokenizer_dir: str | None, out_dir: str) -> list[str]:
    """The tokenizer of ``tokenizer_dir`` (None: no tokenizer) next to the exported model, and
    no other: an earlier export's tokenizer files that this one does not write are removed
    (transformers would load them with this model, whose ids may be another vocabulary's).
    Returns the names copied."""
    copied = [] if tokenizer_dir is None else copy_tokenizer_files(tokenizer_dir, out_dir)
    for name in set(_tokenizer_files(out_dir)) - set(copied):
        os.remove(os.path.join(out_dir, name))
    return copied


def export_tokenizer_dir(run: RunConfig) -> str | None:
    """Where the exported model's tokenizer comes from: the run's Hugging Face tokenizer
    (``--tokenizer-model``), else the ``--hf-checkpoint`` the model started from (its ids are
    the checkpoint's vocabulary whatever tokenizer the run read its data with); None without."""
    if run.data.tokenizer_type == HF_TOKENIZER_TYPE:
        return run.data.tokenizer_model
    return run.checkpoint.hf_checkpoint


def source_generation_config(run: RunConfig) -> str | None:
    """The text of the ``--hf-checkpoint``'s ``generation_config.json`` (its sampling settings,
    not only the token ids the export derives), read before the export writes anything: the
    export may go to the checkpoint's own directory."""
    hf_dir = run.checkpoint.hf_checkpoint
    path = os.path.join(hf_dir, GENERATION_CONFIG_FILENAME) if hf_dir else None
    if path is None or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _replace_tokenizer_on_rank_0(tokenizer_source: str | None, out_dir: str) -> None:
    if torch.distributed.get_rank() == 0:
        _on_disk(replace_tokenizer_files, out_dir, tokenizer_source, out_dir)


def _export_tokenizer_on_rank_0(run: RunConfig, out_dir: str) -> None:
    """The run's tokenizer next to the exported model: GPT2BPETokenizer's written as a Hugging
    Face GPT-2 directory from --vocab-file/--merge-file, else :func:`export_tokenizer_dir`'s."""
    if run.data.tokenizer_type != GPT2_BPE_TYPE:
        _replace_tokenizer_on_rank_0(export_tokenizer_dir(run), out_dir)
    elif torch.distributed.get_rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            save_gpt2_bpe(run.data.vocab_file, run.data.merge_file, folder)
            _on_disk(replace_tokenizer_files, out_dir, folder, out_dir)


def save_hf(run: RunConfig, model: list[torch.nn.Module], out_dir: str | None = None) -> str:
    """Exports a run's (DDP/Float16-wrapped) model chunks to ``out_dir`` (default --save-hf),
    with the tokenizer's files (:func:`_export_tokenizer_on_rank_0`) and the source checkpoint's
    generation config (:func:`source_generation_config`)."""
    out_dir = out_dir or run.checkpoint.save_hf
    config = export_config(run)
    path = export_hf([unwrap(chunk) for chunk in model], out_dir, config,
                     source_generation_config(run))
    agree_on_errors(_export_tokenizer_on_rank_0, run, out_dir)
    print_rank_0(f"> saved Hugging Face checkpoint ({config.architecture}) to {path}")
    return path
