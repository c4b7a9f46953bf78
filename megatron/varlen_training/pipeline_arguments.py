"""Megatron-LM's pipeline split flags: uneven first/last stages, the embedding and the loss
counted as layers, and the virtual pipeline size.

``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` fix the layer
counts of the first / last stage (the rest split evenly over the middle stages);
``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` count
the embedding / the loss as one layer of the first / last stage. Both map to megatron-core's
TransformerConfig fields, whose placement the model build uses on every rank; the checks here
are Megatron-LM's (its ``validate_args`` and TransformerConfig's ``__post_init__``), each a
one-line error naming the flags, so a bad split never reaches an assertion at model build.
``--num-virtual-stages-per-pipeline-rank`` is Megatron-LM's way to give the virtual pipeline
size with uneven stages (``--num-layers-per-virtual-pipeline-stage`` assumes even ones). One
virtual stage per rank is no virtual pipeline (size None), as in Megatron-LM.

``--pipeline-model-parallel-layout`` places every layer itself (megatron-core's
PipelineParallelLayerLayout string, pipeline_layout.py): its stage count over the PP size is the
virtual pipeline size; megatron-core's layout checks are one-line errors here.
``--microbatch-group-size-per-virtual-pipeline-stage`` is the interleaved schedule's micro-batch
group (megatron-core's default: the PP size).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.pipeline_layout import (
    PipelineSplit, layout_chunk_counts, parse_layout,
)

FIRST, LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
EMBEDDING, LOSS = ("--account-for-embedding-in-pipeline-split",
                   "--account-for-loss-in-pipeline-split")
PER_VIRTUAL_STAGE = "--num-layers-per-virtual-pipeline-stage"
VIRTUAL_STAGES = "--num-virtual-stages-per-pipeline-rank"
PP = "--pipeline-model-parallel-size"
LAYOUT = "--pipeline-model-parallel-layout"
MICROBATCH_GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"


def add_pipeline_split_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Megatron-LM pipeline split")
    group.add_argument(FIRST, type=int, default=None,
                       help="Decoder layers of the first pipeline stage (default: an even "
                            "split); the other stages share the rest evenly.")
    group.add_argument(LAST, type=int, default=None,
                       help="Decoder layers of the last pipeline stage (default: an even "
                            "split); the other stages share the rest evenly.")
    group.add_argument(EMBEDDING, action="store_true",
                       help="Count the embedding as one layer of the first stage when "
                            "splitting --num-layers over the pipeline stages.")
    group.add_argument(LOSS, action="store_true",
                       help="Count the output layer and loss as one layer of the last stage "
                            "when splitting --num-layers over the pipeline stages.")
    group.add_argument(VIRTUAL_STAGES, type=int, default=None,
                       help="Virtual pipeline stages (model chunks) per pipeline rank: the "
                            "interleaved schedule's size, also with uneven first/last stages.")
    group.add_argument(LAYOUT, type=str, default=None,
                       help="Megatron-LM's custom layer placement, e.g. \"Ett|(tt|)*2,tL\": E "
                            "embedding, t transformer layer, m MTP layer, L loss, | between "
                            "stages (PP x virtual stages, in schedule order), (...)*N and x*N "
                            "repeat; commas are cosmetic.")
    group.add_argument(MICROBATCH_GROUP, type=int, default=None,
                       dest="microbatch_group_size_per_vp_stage",
                       help="Micro-batches each virtual pipeline stage runs in a row (forward "
                            "and backward) in the interleaved schedule (default: the PP size, "
                            "depth-first); Megatron-LM main's flag, megatron-core 0.16.1's "
                            "field.")


def pipeline_split_of(args) -> PipelineSplit:
    """The split the validated flags describe (virtual pipeline size resolved)."""
    return PipelineSplit(
        num_layers=args.num_layers,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=args.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=args.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=args.pipeline_model_parallel_layout)


def _accounted(args) -> list[str]:
    """The account-for flags given: each adds one layer to the split."""
    return [flag for flag, given in ((EMBEDDING, args.account_for_embedding_in_pipeline_split),
                                     (LOSS, args.account_for_loss_in_pipeline_split)) if given]


def _uneven(args) -> list[str]:
    """The first/last stage flags given, with their values."""
    return [f"{flag} {value}" for flag, value in ((FIRST, args.decoder_first_pipeline_num_layers),
                                                  (LAST, args.decoder_last_pipeline_num_layers))
            if value is not None]


def _split_layers(args) -> tuple[int, str]:
    """(layers the split divides, how to name them): --num-layers, +1 per account-for flag."""
    accounted = _accounted(args)
    if not accounted:
        return args.num_layers, f"--num-layers {args.num_layers}"
    return (args.num_layers + len(accounted),
            f"--num-layers {args.num_layers} + 1 for each of {' and '.join(accounted)}")


def _virtual_pipeline_size(args, require) -> int | None:
    """The virtual pipeline size, from one of the three flags (Megatron-LM: at most one)."""
    per_stage = args.num_layers_per_virtual_pipeline_stage
    stages = args.num_virtual_stages_per_pipeline_rank
    given = [f"{flag} {value}" for flag, value in ((PER_VIRTUAL_STAGE, per_stage),
                                                   (VIRTUAL_STAGES, stages),
                                                   (LAYOUT, args.pipeline_model_parallel_layout))
             if value is not None]
    require(len(given) <= 1, f"{' and '.join(given)} {'both' if len(given) == 2 else 'all'} set "
                             f"the virtual pipeline size: give one of them")
    pp = args.pipeline_model_parallel_size
    if args.pipeline_model_parallel_layout is not None:
        return _layout_virtual_size(args, require)
    if stages is not None:
        require(pp > 1, f"{VIRTUAL_STAGES} needs {PP} > 1")
        return None if stages == 1 else stages  # Megatron-LM: one virtual stage is none
    if per_stage is None:
        return None
    require(pp > 1, f"{PER_VIRTUAL_STAGE} needs {PP} > 1")
    require(not _uneven(args),
            f"{PER_VIRTUAL_STAGE} {per_stage} with {' and '.join(_uneven(args))}: stages of "
            f"uneven sizes take the virtual pipeline size from {VIRTUAL_STAGES} (as in "
            f"Megatron-LM)")
    layers, named = _split_layers(args)
    require(layers % pp == 0, f"{named} is not divisible by {PP} {pp}")
    layers_per_stage = layers // pp
    require(layers_per_stage % per_stage == 0,
            f"{PER_VIRTUAL_STAGE} {per_stage} does not divide the {layers_per_stage} layers of "
            f"each pipeline stage ({named})")
    # Megatron-LM: one virtual stage per rank is no virtual pipeline
    return None if layers_per_stage == per_stage else layers_per_stage // per_stage


def _layout_error(args, err: Exception) -> str:
    """megatron-core's own message of a refused layout, in one line after the flag."""
    return f"{LAYOUT} {args.pipeline_model_parallel_layout!r}: {' '.join(str(err).split())}"


def _layout_virtual_size(args, require) -> int | None:
    """Checks the layout as Megatron-LM's validate_args and TransformerConfig do; its stage
    count over the PP size is the virtual pipeline size (one per rank: None)."""
    layout, pp = args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size
    others = _uneven(args) + _accounted(args)
    require(not others, f"{LAYOUT} with {' and '.join(others)}: the layout places every layer "
                        f"itself; drop the other split flags (megatron-core refuses both)")
    # megatron-core only now: runs without the flag never import it at parse time
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    try:
        num_stages = PipelineParallelLayerLayout.get_num_stages_from_str(layout)
    except AssertionError as err:  # a character outside its grammar
        require(False, _layout_error(args, err))
    require(num_stages % pp == 0,
            f"{LAYOUT} {layout!r} has {num_stages} stages, not a multiple of {PP} {pp} (each "
            f"rank holds the same number of virtual stages)")
    vpp = num_stages // pp
    require(vpp == 1 or pp > 1, f"{LAYOUT} {layout!r} has {num_stages} stages: virtual "
                                f"pipeline stages need {PP} > 1")
    _check_layout_layers(args, require)
    return None if vpp == 1 else vpp


def _check_layout_layers(args, require) -> None:
    """The layer counts named in flag terms, then megatron-core's placement rules (embedding
    first, loss last, MTP after the decoder) in its words."""
    layout, pp = args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size
    for symbol, layer_type, flag, wanted in (
            ("t", "decoder", "--num-layers", args.num_layers),
            ("m", "mtp", "--mtp-num-layers", args.mtp_num_layers or 0)):
        placed = sum(map(sum, layout_chunk_counts(layout, pp, layer_type)))
        require(placed == wanted, f"{LAYOUT} {layout!r} places {placed} layers {symbol!r} but "
                                  f"{flag} is {wanted} (make them equal)")
    try:
        standalone = parse_layout(layout, pp).validate_layer_layout(
            num_layers=args.num_layers, mtp_num_layers=args.mtp_num_layers)
    except (AssertionError, NotImplementedError) as err:
        require(False, _layout_error(args, err))
    # megatron-core's standalone MTP stage (MTP layers away from the output layer) needs the
    # embedding and output weights there too; the GPT chunks here keep MTP beside the loss (a
    # 2-rank run of "Ett|tttt|m|L" hung in the pipeline schedule when this was let through).
    require(not standalone, f"{LAYOUT} {layout!r} puts the MTP layers (m) on another stage than "
                            f"the loss (L): standalone MTP stages are not built here; place m "
                            f"in the loss's stage")


def validate_microbatch_group(args, require) -> None:
    """megatron-core's interleaved schedule checks of the micro-batch group, in flag terms
    (after the micro-batch count is known). Without virtual stages the group is unused, as in
    Megatron-LM. Packed runs round their micro-batch count up to a multiple of the group
    (data.py), so only the fixed count of an unpacked run is checked against it."""
    group = args.microbatch_group_size_per_vp_stage
    pp = args.pipeline_model_parallel_size
    if group is None or args.virtual_pipeline_model_parallel_size is None:
        return
    require(group >= pp, f"{MICROBATCH_GROUP} {group} is below {PP} {pp}: megatron-core's "
                         f"interleaved schedule runs at least PP micro-batches per virtual stage")
    if args.sequence_packing:
        return
    count = args.num_microbatches
    require(group <= count, f"{MICROBATCH_GROUP} {group} exceeds the {count} micro-batches of "
                            f"a step (--global-batch-size / --micro-batch-size / DP)")
    remainder = count % group
    require(remainder == 0 or remainder >= pp,
            f"{MICROBATCH_GROUP} {group} leaves a last group of {remainder} of the {count} "
            f"micro-batches, fewer than {PP} {pp} (megatron-core refuses the pipeline bubbles)")


def _check_even(args, require) -> None:
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    layers, named = _split_layers(args)
    require(layers % pp == 0, f"{named} is not divisible by {PP} {pp}")
    require(vpp is None or (layers // pp) % vpp == 0,
            f"the {layers // pp} layers of each pipeline stage ({named}) are not divisible by "
            f"{VIRTUAL_STAGES} {vpp}")


def _check_uneven(args, require) -> None:
    """megatron-core's TransformerConfig checks of uneven first/last stages, in flag terms."""
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    given = " and ".join(_uneven(args))
    require(not _accounted(args),
            f"{given} with {' and '.join(_accounted(args))}: megatron-core cannot combine fixed "
            f"first/last stage sizes with the embedding or loss counted as a layer; use one way")
    require(pp > 1, f"{given} needs {PP} > 1 (one stage holds every layer)")
    middle_layers, middle_stages = args.num_layers, pp
    for flag, value in ((FIRST, args.decoder_first_pipeline_num_layers),
                        (LAST, args.decoder_last_pipeline_num_layers)):
        if value is None:
            continue
        require(vpp is None or value % vpp == 0,
                f"{flag} {value} is not divisible by the virtual pipeline size {vpp} "
                f"({VIRTUAL_STAGES})")
        middle_layers -= value
        middle_stages -= 1
    if middle_stages == 0:
        require(middle_layers == 0,
                f"{given} add up to {args.num_layers - middle_layers} layers, not --num-layers "
                f"{args.num_layers} ({PP} {pp}: no other stage takes the rest)")
        return
    require(middle_layers > 0 and middle_layers % middle_stages == 0,
            f"{given}: {middle_layers} of --num-layers {args.num_layers} are left for the other "
            f"{middle_stages} pipeline stage(s), which must share them evenly (at least one "
            f"layer each)")
    per_stage = middle_layers // middle_stages
    require(vpp is None or per_stage % vpp == 0,
            f"{given}: the other stages get {per_stage} layers each, not divisible by the "
            f"virtual pipeline size {vpp} ({VIRTUAL_STAGES})")


def validate_pipeline_split(args, require) -> None:
    """Resolves ``virtual_pipeline_model_parallel_size``; checks the split of --num-layers."""
    args.virtual_pipeline_model_parallel_size = _virtual_pipeline_size(args, require)
    if args.pipeline_model_parallel_layout is not None:
        return  # the layout placed every layer (checked with it)
    if _uneven(args):
        _check_uneven(args, require)
    else:
        _check_even(args, require)
