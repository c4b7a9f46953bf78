"""Functions the hf tests run on multirank ranks (importable by name)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from megatron.core import parallel_state as ps
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
from megatron.varlen_training.model import unwrap
from megatron.varlen_training.model_family import GPT
from megatron.varlen_training.trainer import Trainer
from megatron.varlen_training.training import run_forward_backward


def _gather_tp_last_dim(tensor: torch.Tensor) -> torch.Tensor:
    size = ps.get_tensor_model_parallel_world_size()
    if size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(size)]
    torch.distributed.all_gather(parts, tensor.contiguous(),
                                 group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def forward_logits(run, model, tokens: torch.Tensor) -> torch.Tensor | None:
    """Full-vocabulary logits [b, s, V_padded] through the pipeline schedule (last stage)."""
    positions = torch.arange(tokens.shape[1]).expand(run.training.micro_batch_size, -1)
    microbatches = [{"tokens": t, "position_ids": positions}
                    for t in tokens.split(run.training.micro_batch_size)]
    captured = []

    def step_func(data_iterator, chunk):
        batch = next(data_iterator)
        output = chunk(batch["tokens"], batch["position_ids"], None)

        def loss(output_tensor):
            captured.append(_gather_tp_last_dim(output_tensor.detach()))
            return output_tensor.sum() * 0, {}
        return output, loss

    step = SimpleNamespace(microbatches=microbatches, num_microbatches=len(microbatches))
    run_forward_backward(run, SimpleNamespace(model=model), step, forward_only=True,
                         forward_step_func=step_func)
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    return torch.cat(captured)


class _CountingReads:
    """Counts the elements every SafetensorsReader.read returns on this rank."""

    def __init__(self):
        from megatron.varlen_training.hf.safetensors_io import SafetensorsReader

        self.elements = 0
        self._cls, self._original = SafetensorsReader, SafetensorsReader.read

        def counted(reader, name, rows=None, cols=None):
            tensor = self._original(reader, name, rows, cols)
            self.elements += tensor.numel()
            return tensor
        SafetensorsReader.read = counted

    def close(self):
        self._cls.read = self._original


def rank_import_logits(runs: dict, tokens: torch.Tensor) -> dict:
    """For each named argv: logits of the model initialised from its --hf-checkpoint (None off
    the last stage), the model's RoPE inverse frequencies (None for MLA, whose layers hold
    their own), and the elements this rank read from the checkpoint next to the elements its
    parameters hold."""
    out = {}
    for name, argv in runs.items():
        reads = _CountingReads()
        run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
        initialize_model_parallel(run.parallel, run.model.moe)
        set_random_seeds(run.training.seed)
        try:
            model = GPT.model_provider(run)[1]
            reads.close()
            held = sum(p.numel() for chunk in model for p in unwrap(chunk).parameters())
            logits = forward_logits(run, model, tokens)
            rope = getattr(unwrap(model[0]), "rotary_pos_emb", None)  # MLA: in its layers
            inv_freq = None if rope is None else rope.inv_freq.clone()
            out[name] = {"logits": logits, "inv_freq": inv_freq, "read": reads.elements,
                         "held": held}
        finally:
            reads.close()
            ps.destroy_model_parallel()
    return out


def _local_params(model) -> dict:
    from megatron.varlen_training.layout_invariant_init import canonical_parameter_name

    out = {}
    for chunk in model:
        module = unwrap(chunk)
        for name, param in module.named_parameters():
            key = canonical_parameter_name(module, name, tied_output=False) + f"@{name}"
            out[key] = param.detach().clone()
    return out


def rank_train_export(runs: dict, tokens: torch.Tensor) -> dict:
    """For each named (argv, reimport argv): train through pretrain's path (which ends with
    --save-hf), then return our logits and whether re-importing the export gives the trained
    weights bit for bit."""
    from megatron.varlen_training.pretrain import pretrain

    out = {}
    world = torch.distributed.get_world_size()
    for name, (argv, reimport_argv) in runs.items():
        trainer = Trainer(parse_run_config(argv, world_size=world))
        try:
            history = pretrain(trainer)
            logits = forward_logits(trainer.run, trainer.state.model, tokens)
            trained = _local_params(trainer.state.model)
            again = parse_run_config(reimport_argv, world_size=world)
            reimported = _local_params(GPT.model_provider(again)[1])
            differ = sorted(k for k in trained if not torch.equal(trained[k], reimported[k]))
            out[name] = {"logits": logits, "differ": differ, "history": history,
                         "num_params": len(trained)}
        finally:
            trainer.close()
    return out


def rank_packed_token_losses(argv: list[str]) -> dict:
    """Per-token losses of the first global batch through the packed (dynamic CP) data path,
    forward only, keyed by what each token is: (position, token, label) and its loss; plus
    the batch's samples (rank 0) and the largest CP group a micro-batch used."""
    from megatron.varlen_training.datasets.builder import build_datasets
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.tokenizer import build_tokenizer

    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()))
    try:
        run = trainer.start().run
        provider = build_data_providers(trainer).train
        step = provider.step_batches(0)
        model = GPT.model_provider(run)[1]
        records, cp_sizes = [], []

        def step_func(data_iterator, chunk):
            batch = next(data_iterator)
            params = batch["packed_seq_params"]
            cp_sizes.append(getattr(params, "local_cp_size", None) or 1)
            losses = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                           packed_seq_params=params)

            def loss(output):
                keep = batch["loss_mask"].reshape(-1) > 0
                records.append(torch.stack([batch["position_ids"].reshape(-1)[keep].double(),
                                            batch["tokens"].reshape(-1)[keep].double(),
                                            batch["labels"].reshape(-1)[keep].double(),
                                            output.detach().reshape(-1)[keep].double()], dim=1))
                return output.sum() * 0, {}
            return losses, loss

        run_forward_backward(run, SimpleNamespace(model=model), step, forward_only=True,
                             forward_step_func=step_func)
        samples = None
        if torch.distributed.get_rank() == 0:
            train_ds, _ = build_datasets(run, build_tokenizer(
                run.data.tokenizer_type, run.model.vocab_size, run.data.tokenizer_model))
            samples = [train_ds[i] for i in range(run.training.global_batch_size)]
        return {"records": torch.cat(records) if records else torch.zeros(0, 4),
                "samples": samples, "max_cp": max(cp_sizes)}
    finally:
        trainer.close()


def rank_import_export(argv: list[str], out_dir: str) -> None:
    """Builds the model from --hf-checkpoint and exports it untouched to ``out_dir``."""
    from megatron.varlen_training.hf.exporter import save_hf

    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    initialize_model_parallel(run.parallel, run.model.moe)
    set_random_seeds(run.training.seed)
    try:
        save_hf(run, GPT.model_provider(run)[1], out_dir)
    finally:
        ps.destroy_model_parallel()


def rank_gradient_export(argv: list[str], out_dir: str) -> dict:
    """One forward-backward of the first global batch through the run's real path (packing,
    dynamic CP, loss, finalize_model_grads: the gradient of the global per-token mean), then
    each parameter's gradient written in its place and the model exported to ``out_dir``, so
    transformers' names and layouts come from our exporter. Returns the batch's samples (rank 0)
    and the largest CP group a micro-batch used."""
    from megatron.varlen_training.datasets.builder import build_datasets
    from megatron.varlen_training.hf.exporter import save_hf
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.tokenizer import build_tokenizer

    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()))
    try:
        run = trainer.start().run
        state = trainer.setup_model_and_optimizer()
        provider = build_data_providers(trainer).train
        step = provider.step_batches(0)
        cp_sizes = [getattr(mb.get("packed_seq_params"), "local_cp_size", None) or 1
                    for mb in step.microbatches]
        for chunk in state.model:
            chunk.zero_grad_buffer()
        run_forward_backward(run, state, step, forward_only=False)
        with torch.no_grad():
            for chunk in state.model:
                for param in chunk.parameters():
                    param.copy_(param.main_grad)
        save_hf(run, state.model, out_dir)
        samples = None
        if torch.distributed.get_rank() == 0:
            train_ds, _ = build_datasets(run, build_tokenizer(
                run.data.tokenizer_type, run.model.vocab_size, run.data.tokenizer_model))
            samples = [train_ds[i] for i in range(run.training.global_batch_size)]
        return {"samples": samples, "max_cp": max(cp_sizes)}
    finally:
        trainer.close()


def rank_import_exports(jobs: list[tuple[list[str], str]]) -> None:
    """:func:`rank_import_export` for each ``(argv, out_dir)`` (one launch for many layouts)."""
    for argv, out_dir in jobs:
        rank_import_export(argv, out_dir)


def rank_train(runs: dict) -> dict:
    """Trains each named argv through pretrain's path (which ends with its --save-hf); the
    per-iteration lm loss of each (None off the last stage)."""
    from megatron.varlen_training.pretrain import pretrain

    out = {}
    for name, argv in runs.items():
        trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()))
        try:
            out[name] = [record.get("lm_loss") for record in pretrain(trainer)]
        finally:
            trainer.close()
    return out


def rank_export_checkpoint(argv: list[str], out_dir: str) -> None:
    """What tools/export_hf.py does, on these ranks: the model of ``argv`` (no MTP flags), the
    model weights of its --load checkpoint, exported to ``out_dir``."""
    from megatron.varlen_training.hf.export_tool import load_model_weights
    from megatron.varlen_training.hf.exporter import save_hf

    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    initialize_model_parallel(run.parallel, run.model.moe)
    set_random_seeds(run.training.seed)
    try:
        model = GPT.model_provider(run)[1]
        load_model_weights(run.checkpoint.load, model)
        save_hf(run, model, out_dir)
    finally:
        ps.destroy_model_parallel()


def _packed_params(lengths: list[int]):
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           cu_seqlens_q_padded=cu, cu_seqlens_kv_padded=cu,
                           max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def rank_packed_logits_export(jobs: list[tuple[list[str], list[torch.Tensor], str]]) -> list:
    """For each ``(argv, sequences, out_dir)`` on one rank: the model initialised from the
    argv's --hf-checkpoint runs the sequences packed into one THD micro-batch (its logits
    [tokens, V_padded] come back), then is exported untouched to ``out_dir``."""
    from megatron.varlen_training.hf.exporter import save_hf

    out = []
    for argv, sequences, out_dir in jobs:
        run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
        initialize_model_parallel(run.parallel, run.model.moe)
        set_random_seeds(run.training.seed)
        try:
            model = GPT.model_provider(run)[1]
            tokens = torch.cat(sequences)[None]
            positions = torch.cat([torch.arange(len(s)) for s in sequences])[None]
            params = _packed_params([len(s) for s in sequences])
            with torch.no_grad():
                logits = unwrap(model[0])(tokens, positions, None, packed_seq_params=params)
            out.append(logits[0].clone())
            save_hf(run, model, out_dir)
        finally:
            ps.destroy_model_parallel()
    return out
