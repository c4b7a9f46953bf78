"""Learned absolute positions and packing. A sequence is padded to a multiple of
2 x its CP group size (x TP with sequence parallelism), which can exceed
--max-position-embeddings; the embedding lookup then failed with IndexError at whatever
iteration first drew such a sample. Padding, fillers and idle ranks' dummies now sit at position
0, so no pack holds a position beyond its longest real sample: the layouts
that crashed train, and start-up only needs --seq-length <= --max-position-embeddings (checked
for every run, as Megatron-LM does).

The fuzz runs length distributions through the real scheduler and the real pack builder for
many layouts and asserts every position id fits the table whenever start-up accepted the flags
(and that only a --seq-length beyond the table is refused); the multi-rank runs show the same end
to end: the observed layouts train, a too-long --seq-length is refused at start-up."""

import itertools
import random

import pytest
import torch

from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.arguments import (
    ArgumentValidationError, build_parser, parse_args, validate_args,
)
from megatron.varlen_training.data import build_packing_config
from megatron.varlen.packing import thd_microbatch
from megatron.varlen.scheduling import ScheduleProblem, get_scheduler
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank

PAD_ID = 0
POSITION_REASON = "exceeds --max-position-embeddings"
# Lengths the padding rules (multiples of 2, 4, 6, 8, 10, ...) mostly do not divide.
SEQ_LENGTHS = (30, 37, 50, 64, 97, 126, 250, 256)
WIDER_CASES = 200  # layouts with a static CP size > 1 (seq lengths must divide its padding)
BATCHES_PER_CASE = 2


def _argv(seq, world_cp, tp_sp, vpp, dynamic, budget, position, max_pos=None) -> list[str]:
    cp, dp = world_cp
    tp, sp = tp_sp
    layers = 4 if vpp else 2
    argv = ["--num-layers", str(layers), "--hidden-size", "32", "--num-attention-heads", "4",
            "--seq-length", str(seq), "--lr", "1e-3", "--train-iters", "1", "--mock-data",
            "--sft", "--vocab-size", "128", "--make-vocab-size-divisible-by", "32",
            "--micro-batch-size", "1", "--global-batch-size", str(dp * 4),
            "--sequence-packing", "--context-parallel-size", str(cp), "--eval-iters", "0",
            "--position-embedding-type", position, "--tensor-model-parallel-size", str(tp)]
    argv += ["--sequence-parallel"] if sp else []
    argv += ["--pipeline-model-parallel-size", "2",
             "--num-layers-per-virtual-pipeline-stage", "1"] if vpp else []
    argv += ["--dynamic-context-parallel"] if dynamic else []
    argv += ["--max-seqlen-per-dp-cp-rank", str(budget)] if budget else []
    argv += ["--max-position-embeddings", str(max_pos)] if max_pos else []
    return argv


def _cases():
    """Layouts over DP x CP sizes 1-8 (every one with static CP size 1, where dynamic CP runs;
    a seeded sample of the others), TP 1/2 with sequence parallelism on/off, VPP on/off,
    static/dynamic CP, both position types, and a seeded budget from the smallest that holds a
    --seq-length sample on all ranks up to --seq-length."""
    variants = list(itertools.product([(1, False), (2, False), (2, True)], [False, True],
                                      [False, True], ["learned_absolute", "rope"]))
    rng = random.Random(21)
    cp1 = [(seq, (1, n), *variant) for seq in SEQ_LENGTHS for n in range(1, 9)
           for variant in variants]
    wider = [(seq, (cp, n // cp), *variant) for seq in SEQ_LENGTHS for n in range(2, 9)
             for cp in range(2, n + 1) if n % cp == 0 for variant in variants]
    cases = []
    for seq, (cp, dp), tp_sp, vpp, dynamic, position in cp1 + rng.sample(wider, WIDER_CASES):
        holders, even = (cp * dp if dynamic else cp), 2 * tp_sp[0]  # VPP needs even budgets
        budgets = [-(-seq // holders) + even, -(-seq // 2), seq]
        budget = -(-rng.choice(budgets) // even) * even
        cases.append((seq, (cp, dp), tp_sp, vpp, dynamic,
                      rng.choice([budget, None]) if not dynamic else budget, position))
    return cases


def _batch_lengths(rng, seq: int, count: int) -> list[int]:
    """A global batch with the longest sample, near-longest ones, and short ones."""
    pool = [seq, seq - 1, max(1, seq - 3), max(1, seq // 2 + 1), 1, 2, 3]
    return [seq] + [rng.choice(pool) if rng.random() < 0.5 else rng.randint(1, seq)
                    for _ in range(count - 1)]


def _sample(length: int) -> dict:
    return {"tokens": torch.ones(length, dtype=torch.long), "labels": torch.ones(length),
            "loss_mask": torch.ones(length)}


def _longest_position_run(args, lengths: list[int]) -> int:
    """max(position id) + 1 over every pack every rank builds for this global batch, through
    the real scheduler and thd_microbatch (as GlobalBatchPacker does)."""
    config = build_packing_config(run_config(args), PAD_ID)
    dp, cp = args.data_parallel_size, args.context_parallel_size
    problem = ScheduleProblem(
        lengths=lengths, dp_size=dp, cp_size=cp, max_seqlen_per_rank=config.max_seqlen_per_rank,
        min_cp_size=config.min_cp_size, sp_factor=config.sp_factor,
        vpp_group_size=config.vpp_group_size, min_num_microbatches=config.min_num_microbatches,
        owners=tuple(i * dp // len(lengths) for i in range(len(lengths))), cost=config.cost)
    schedule = get_scheduler(config.scheduler)(problem)
    fixed = config.fixed_tokens_per_rank
    packs = {(): thd_microbatch.dummy_pack(PAD_ID, config.sp_factor, fixed)}  # idle ranks
    for m, ranks in enumerate(schedule.microbatches):
        for rank, ids in enumerate(ranks):
            if ids in packs:
                continue  # every rank of a CP group builds the same pack
            size = len(schedule.group_ranks(m, rank))
            packs[ids] = thd_microbatch.pack_sequences(
                [_sample(lengths[i]) for i in ids], [schedule.padded_lengths[i] for i in ids],
                local_cp_size=size, pad_id=PAD_ID, sample_ids=tuple(ids),
                total_tokens=fixed * size if fixed else None)
    return max(int(pack.position_ids.max()) + 1 for pack in packs.values())


def _parse(argv, world):
    try:
        return parse_args(argv, world_size=world), None
    except ArgumentValidationError as err:
        return None, str(err)


# The fuzz's ~1,700 parses share one parser: parse_args builds a fresh one per call (~700
# flags; most of the fuzz's time) so that --hf-checkpoint and --use-checkpoint-args can set
# its defaults, which no argv here gives. validate_args copies the namespace it is given, so
# the shared parser's defaults stay as built (test_the_fuzz_parses_as_parse_args).
_FUZZ_PARSER = build_parser()


def _fuzz_parse(argv, world):
    """:func:`_parse` on :data:`_FUZZ_PARSER`."""
    try:
        args = _FUZZ_PARSER.parse_args(argv)
        args.world_size = world
        return validate_args(args), None
    except ArgumentValidationError as err:
        return None, str(err)


def _assert_fits(args, rng, seq: int) -> int:
    longest = 0
    for _ in range(BATCHES_PER_CASE):
        longest = max(longest, _longest_position_run(
            args, _batch_lengths(rng, seq, args.global_batch_size)))
    if args.position_embedding_type == "learned_absolute":
        assert longest <= args.max_position_embeddings, (
            f"start-up accepted --max-position-embeddings {args.max_position_embeddings} but a "
            f"pack holds positions 0..{longest - 1}")
    return longest


# torch threads for the fuzz: its tensors hold tens of elements, too few to share out.
FUZZ_THREADS = 1


@pytest.fixture
def few_torch_threads():
    """The fuzz is ~10^5 tiny tensor operations: on torch's default of every core each one
    hands work between threads. A loaded 2-core machine ran it in 111 s (serial pytest, 2
    threads); 8 s on one thread, 26 s on two, side by side. The threads are restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(FUZZ_THREADS)
    yield
    torch.set_num_threads(previous)


def test_every_accepted_layout_fits_its_position_table(few_torch_threads):
    rng = random.Random(4)
    outcomes = {"accepted_learned": 0, "accepted_rope": 0, "refused_for_positions": 0}
    for seq, (cp, dp), (tp, sp), vpp, dynamic, budget, position in _cases():
        world = cp * dp * tp * (2 if vpp else 1)
        short_table = seq - 1 if rng.random() < 0.2 else None  # one row short of a sample
        argv = _argv(seq, (cp, dp), (tp, sp), vpp, dynamic, budget, position, short_table)
        args, error = _fuzz_parse(argv, world)
        if args is not None:
            assert short_table is None, argv
            outcomes["accepted_learned" if position == "learned_absolute" else
                     "accepted_rope"] += 1
            # Padding, fillers and idle ranks' dummies sit at position 0: no layout, RoPE or
            # learned, holds a position beyond the longest real sample.
            assert _assert_fits(args, rng, seq) <= seq
            continue
        if POSITION_REASON in error:
            assert short_table == seq - 1, error  # the table is short of a real sample
            outcomes["refused_for_positions"] += 1
    # Not vacuous: each side of the rule was exercised.
    assert min(outcomes.values()) > 0, outcomes


# The fuzz's first cases: layouts of every kind, accepted and refused ones.
EQUIVALENCE_CASES = 40


def test_the_fuzz_parses_as_parse_args():
    """The shared parser accepts and refuses as parse_args does, with the same namespace (or
    error), also after it has parsed the command lines before: a parse leaves nothing behind."""
    outcomes = set()
    for seq, (cp, dp), tp_sp, vpp, dynamic, budget, position in _cases()[:EQUIVALENCE_CASES]:
        world = cp * dp * tp_sp[0] * (2 if vpp else 1)
        for short_table in (None, seq - 1):
            argv = _argv(seq, (cp, dp), tp_sp, vpp, dynamic, budget, position, short_table)
            fresh = _parse(argv, world)
            assert _fuzz_parse(argv, world) == fresh, argv
            outcomes.add(fresh[0] is None)
    assert outcomes == {True, False}  # accepted and refused ones compared


@pytest.mark.parametrize("world, seq, budget", [
    (3, 256, 96),   # a 256-token sample on a CP group of 3 pads to 258
    (2, 250, 128),  # ... and a 250-token one on 2 ranks to 252
])
def test_observed_layouts_start_with_the_default_table(world, seq, budget):
    for position in ("learned_absolute", "rope"):
        args, error = _parse(_argv(seq, (1, world), (1, False), False, True, budget, position),
                             world)
        assert error is None and args.max_position_embeddings == seq, error


def test_a_sequence_longer_than_the_table_is_refused_in_one_line():
    args, error = _parse(_argv(64, (1, 2), (1, False), False, True, 64, "learned_absolute",
                               max_pos=48), 2)
    assert args is None and error == (
        "--seq-length 64 exceeds --max-position-embeddings 48 (raise --max-position-embeddings)"
    ), error


# --- real training runs: refused at start-up, or trained; never an error mid-run --------------


def _train_or_refuse(argv: list[str]) -> dict:
    try:
        history = train_on_this_rank(argv)["history"]
    except ArgumentValidationError as err:
        return {"refused": str(err)}
    return {"refused": None, "losses": [h["lm_loss"] for h in history]}


def _training_argv(tmp_path, seq: int, budget: int, ranks: int, max_pos=None) -> list[str]:
    lengths = tmp_path / "lengths.csv"  # every global batch holds --seq-length samples
    lengths.write_text("length\n" + "\n".join(str(n) for n in [seq, 40, seq - 1, 7] * 4) + "\n")
    config = f'{{"mode": "file", "path": "{lengths}"}}'
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
            "--seq-length", str(seq), "--lr", "1e-3", "--train-iters", "2", "--mock-data",
            "--sft", "--sft-mock-dataset-config-json", config, "--vocab-size", "128",
            "--make-vocab-size-divisible-by", "32", "--micro-batch-size", "1",
            "--global-batch-size", str(ranks), "--hidden-dropout", "0", "--attention-dropout",
            "0", "--eval-iters", "0", "--log-interval", "1", "--dynamic-context-parallel",
            "--max-seqlen-per-dp-cp-rank", str(budget), "--position-embedding-type",
            "learned_absolute"]
    return argv + (["--max-position-embeddings", str(max_pos)] if max_pos else [])


@pytest.mark.parametrize("ranks, seq, budget", [(3, 256, 96), (5, 256, 64)])
def test_learned_positions_train_where_padding_outgrows_the_table(tmp_path, ranks, seq, budget):
    """The runs that crashed with IndexError at iteration 1: the padded length (258 on 3 ranks,
    260 on 5) exceeds the default table of --seq-length rows; they train now."""
    results = run_distributed(_train_or_refuse, ranks,
                              args=(_training_argv(tmp_path, seq, budget, ranks),), timeout_s=240)
    assert all(result["refused"] is None for result in results), results
    losses = [loss for result in results for loss in result["losses"] if loss is not None]
    assert losses and all(loss == loss and loss < 100 for loss in losses), results
