"""Megatron-LM flags of whole workloads this fork does not run, and the one line that says so.

Megatron-LM's parser also carries the flags of its inference server, RL, vision, BERT/T5 and
retriever models, logits distillation and a few tools. A GPT pretraining command line never
needs them, so they are not registered (about 200 flags that would only bloat the flag
reference and the megatron.wrap view); when one is given, argparse's "unrecognized arguments"
becomes one line naming the flag's family and that it is not in this fork (exit 2). Unlike the
refused flags of a training feature (refused_flags.py), no value of them is accepted: there is
no neutral use of another workload's flag. The hybrid-model flags, known only to
pretrain_mamba.py, get a line pointing there.

tests/unit_tests/varlen_training/test_megatron_lm_flag_census.py lists the same families
(tests/unit_tests/data/megatron_lm_flags.txt holds Megatron-LM's flags) and proves that every
Megatron-LM flag is known to a parser here or answered by a family below.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlagFamily:
    """Flags of one workload: those starting with a prefix in ``prefixes`` or named in
    ``names``; ``what`` names the workload in the error line ("a Megatron-LM {what} flag")."""

    what: str
    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()

    def owns(self, flag: str) -> bool:
        return flag in self.names or flag.startswith(self.prefixes)


# Megatron-LM's workloads whose flags a GPT/hybrid pretraining run never takes.
OUT_OF_SCOPE_FAMILIES = (
    FlagFamily("inference / dynamic-batching / text-generation-server",
               ("--inference-", "--no-inference-", "--mamba-inference-"),
               frozenset({"--decode-only-cuda-graphs", "--enable-chunked-prefill",
                          "--num-speculative-tokens", "--flash-decode", "--max-tokens-to-oom",
                          "--use-legacy-static-engine", "--mlp-chunks-for-prefill",
                          "--nccl-all-reduce-for-prefill",
                          "--moe-pad-experts-for-cuda-graph-inference"})),
    FlagFamily("RL / GRPO", ("--rl-", "--no-rl-", "--grpo-"),
               frozenset({"--perform-rl-step", "--langrl-env-config", "--refit-method"})),
    FlagFamily("vision (ViT / DINO / Swin)", ("--dino-", "--vision-"),
               frozenset({"--img-h", "--img-w", "--num-channels", "--patch-dim",
                          "--num-classes", "--classes-fraction", "--data-per-class-fraction",
                          "--swin-backbone-type", "--mask-type", "--mask-factor",
                          "--iter-per-epoch", "--mrope-section"})),
    FlagFamily("BERT / T5 / biencoder / retriever / ICT",
               ("--bert-", "--biencoder-", "--ict-", "--retriever-", "--indexer-"),
               frozenset({"--titles-data-path", "--query-in-block-prob", "--use-one-sent-docs",
                          "--evidence-data-path", "--block-data-path", "--embedding-path",
                          "--output-bert-embeddings", "--mask-prob", "--short-seq-prob",
                          "--encoder-num-layers", "--decoder-num-layers",
                          "--relative-attention-num-buckets",
                          "--relative-attention-max-distance", "--sample-rate"})),
    FlagFamily("logits-distillation", ("--logits-save-", "--logits-load-")),
    FlagFamily("workload-inspector", (),
               frozenset({"--run-workload-inspector-server"})),
    FlagFamily("kitchen (NVIDIA's quantization extension)", ("--kitchen-",),
               frozenset({"--use-kitchen-attention"})),
    FlagFamily("fault-injector", ("--fault-injector-",)),
    FlagFamily("Multi-Storage Client (MSC)", (), frozenset({"--enable-msc"})),
)
# Megatron-LM's hybrid-model flags: pretrain_mamba.py's parser knows them, pretrain_gpt.py's not.
HYBRID_FAMILY = FlagFamily("hybrid-model", ("--mamba-", "--hybrid-"),
                           frozenset({"--is-hybrid-model", "--disable-mamba-mem-eff-path"}))
NOT_IN_THIS_FORK = "not in this fork, which trains GPT and hybrid models only"
RUN_THE_HYBRID_ENTRY_POINT = "run pretrain_mamba.py, whose parser takes it"


def flag_name(token: str) -> str:
    """``--flag`` of a command-line token (``--flag=value`` included)."""
    return token.split("=", 1)[0]


def family_of(flag: str) -> FlagFamily | None:
    """The out-of-scope family owning ``flag``, else None."""
    return next((family for family in OUT_OF_SCOPE_FAMILIES if family.owns(flag)), None)


def unrecognized_message(extras: list[str]) -> str:
    """The one-line error for the tokens argparse did not recognise: the first flag among them
    named with its family when it has one, else argparse's own message."""
    flags = [flag_name(token) for token in extras if token.startswith("--")]
    if flags:
        first = flags[0]
        family = family_of(first)
        if family is not None:
            return f"{first} is a Megatron-LM {family.what} flag: {NOT_IN_THIS_FORK}"
        if HYBRID_FAMILY.owns(first):
            return (f"{first} is a Megatron-LM {HYBRID_FAMILY.what} flag: "
                    f"{RUN_THE_HYBRID_ENTRY_POINT}")
    return f"unrecognized arguments: {' '.join(extras)}"
