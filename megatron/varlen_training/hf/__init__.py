"""Hugging Face checkpoints for our GPT model: config mapping, sliced import, sharded export.

- :mod:`.config`: ``config.json`` <-> our flags (Llama, Qwen2, Qwen3, Qwen3-MoE), one place;
  :mod:`.deepseek`: DeepSeek-V3's keys (MLA + MoE).
- :mod:`.arguments`: ``--hf-checkpoint``/``--save-hf`` and the Llama/Qwen model flags.
- :mod:`.weights`: which HF tensors make each megatron-core parameter, TP slicing both ways.
- :mod:`.safetensors_io`: sliced reads, shard and index writes.
- :mod:`.importer` / :mod:`.exporter`: model chunks <- / -> a checkpoint directory.
- :mod:`.export_tool`: Megatron checkpoint -> HF directory (``tools/export_hf.py``).

Modules import ``safetensors``/``transformers`` lazily: the flags work without the ``[hf]`` extra.
"""
