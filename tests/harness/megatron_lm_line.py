"""A parser of Megatron-LM's iteration line, written from its format strings (read as facts in
Megatron-LM core_v0.16.1 ``megatron/training/training.py``, ``training_log``), never from this
fork's formatter: the tests hand it our real lines.

Megatron-LM builds the line as ``f" [{datetime.now():%Y-%m-%d %H:%M:%S.%f}]"`` followed by
fields each written ``" {label}: {value:{spec}} |"``, in a fixed order, some only when a flag
or a value asks for them. :func:`parse_iteration_line` checks the timestamp, the order, the
spacing and each value's format: a value must read back to the same text under Megatron-LM's
format spec (``throughput ... 12.3456`` fails ``.1f``). Fields after Megatron-LM's last one
(``number of nan iterations``) are this fork's additions, returned apart; none may reuse a
Megatron-LM label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
HEADER = re.compile(r"^ \[(?P<stamp>[^\]]+)\] "
                    r"iteration (?P<iteration>[^/]{8,})/(?P<train>[^|]{8,}) \|")
ALWAYS, OPTIONAL, LOSSES = "always", "optional", "losses"
# (label, format spec, presence): core_v0.16.1 training_log, in its order. Losses are any
# number of '{key}: {avg:.6E}', each printed only when its average is above zero.
FIELDS = (
    ("consumed samples", "12d", ALWAYS),
    ("skipped samples", "12d", OPTIONAL),  # only when samples were skipped
    ("elapsed time per iteration (ms)", ".1f", ALWAYS),
    ("throughput per GPU (TFLOP/s/GPU)", ".1f", OPTIONAL),  # --log-throughput
    ("energy per GPU (J/iter/GPU)", ".1f", OPTIONAL),  # --log-energy
    ("power per GPU (W/GPU)", ".1f", OPTIONAL),
    ("learning rate", ".6E", ALWAYS),
    ("global batch size", "5d", ALWAYS),
    (None, ".6E", LOSSES),
    ("loss scale", ".1f", ALWAYS),
    ("grad norm", ".3f", OPTIONAL),  # None when the fp16 scaler skipped the step
    ("num zeros", "d", OPTIONAL),  # --log-num-zeros-in-grad, '{}' of an int
    ("params norm", ".3f", OPTIONAL),  # --log-params-norm
    ("number of skipped iterations", "3d", ALWAYS),
    ("number of nan iterations", "3d", ALWAYS),
)
LABELS = {label for label, _, _ in FIELDS if label is not None}


@dataclass
class IterationLine:
    """One parsed line: Megatron-LM's fields by label (their text), losses, the fork's tail."""

    stamp: datetime
    iteration: int
    train_iters: int
    fields: dict[str, str] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    extras: dict[str, str] = field(default_factory=dict)

    def number(self, label: str) -> float:
        return float(self.fields[label])


def _reads_back(text: str, spec: str) -> bool:
    """``text`` is what ``format(value, spec)`` prints for the value it reads as."""
    try:
        value = int(text) if spec.endswith("d") else float(text)
    except ValueError:
        return False
    return format(value, spec) == text


def _tokens(rest: str) -> list[tuple[str, str]]:
    """``' a: 1 | b: 2 |'`` -> ``[("a", "1"), ("b", "2")]``; each field is ' label: value |'."""
    assert rest.endswith(" |"), f"the line must end in ' |': {rest[-20:]!r}"
    pieces = rest[:-2].split(" |")
    tokens = []
    for piece in pieces:
        assert piece.startswith(" ") and not piece.startswith("  "), f"spacing: {piece!r}"
        label, sep, value = piece[1:].partition(": ")
        assert sep, f"a field without ': ': {piece!r}"
        tokens.append((label, value))
    return tokens


def parse_iteration_line(message: str) -> IterationLine:
    """Parses the message after the log prefix and level; AssertionError names what differs."""
    header = HEADER.match(message)
    assert header, f"not Megatron-LM's ' [timestamp] iteration N/ M |' start: {message[:60]!r}"
    stamp = datetime.strptime(header["stamp"], TIMESTAMP_FORMAT)
    assert stamp.strftime(TIMESTAMP_FORMAT) == header["stamp"], header["stamp"]
    for name in ("iteration", "train"):
        assert _reads_back(header[name], "8d"), f"{name} {header[name]!r} is not '{{:8d}}'"
    line = IterationLine(stamp, int(header["iteration"]), int(header["train"]))
    tokens = _tokens(message[header.end():])
    position = 0
    for label, spec, presence in FIELDS:
        if presence == LOSSES:
            while position < len(tokens) and tokens[position][0] not in LABELS:
                key, value = tokens[position]
                assert _reads_back(value, spec), f"loss {key}: {value!r} is not '{{:{spec}}}'"
                assert float(value) > 0.0, f"Megatron-LM prints no loss average <= 0: {key}"
                line.losses[key] = float(value)
                position += 1
            continue
        if position < len(tokens) and tokens[position][0] == label:
            value = tokens[position][1]
            assert _reads_back(value, spec), f"{label}: {value!r} is not '{{:{spec}}}'"
            line.fields[label] = value
            position += 1
        else:
            assert presence == OPTIONAL, f"{label!r} missing or out of order in {message!r}"
    for label, value in tokens[position:]:
        assert label not in LABELS, f"Megatron-LM's {label!r} out of its place: {message!r}"
        line.extras[label] = value
    return line
