"""A parser of Megatron-LM's progress.txt lines, written from its format strings (read as facts
in Megatron-LM core_v0.16.1: ``append_to_progress_log`` in ``megatron/training/utils.py`` and
``compute_throughputs_and_append_to_progress_log`` in ``megatron/training/training.py``), never
from this fork's writer: the tests hand it our real files.

Megatron-LM writes each line as
``f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}\\tJob ID: {job_id}\\t"
f"# GPUs: {num_gpus}\\t{string}\\n"``, where ``string`` is ``"Starting job"`` or, after a
save, ``f"Saved checkpoint\\tIteration: {iteration}\\t"
f"Job throughput: {job_throughput:.1f} TFLOP/s/GPU\\t"
f"Cumulative throughput: {cumulative_throughput:.1f} TFLOP/s/GPU\\t"
f"Floating-point operations: {num_floating_point_operations_so_far:.2e}\\t"
f"Tokens (in billions): {tokens_so_far / 10**9:.2f}"``.
:func:`parse_progress_line` checks the separators, the field names and order, and that every
value reads back to the same text under Megatron-LM's format spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

STAMP_FORMAT = "%Y-%m-%d %H:%M:%S"
STARTING_JOB, SAVED_CHECKPOINT = "Starting job", "Saved checkpoint"
# The fields after "Saved checkpoint": (label, format spec, unit after the value).
SAVED_FIELDS = (
    ("Iteration", "d", ""),
    ("Job throughput", ".1f", " TFLOP/s/GPU"),
    ("Cumulative throughput", ".1f", " TFLOP/s/GPU"),
    ("Floating-point operations", ".2e", ""),
    ("Tokens (in billions)", ".2f", ""),
)


@dataclass
class ProgressLine:
    """One parsed line: its stamp, job id, number of GPUs, event and the event's values."""

    stamp: datetime
    job_id: str
    num_gpus: int
    event: str
    values: dict[str, float] = field(default_factory=dict)


def _value(text: str, spec: str) -> float:
    value = int(text) if spec == "d" else float(text)
    assert format(value, spec) == text, f"{text!r} is not written as {spec!r}"
    return value


def _labelled(piece: str, label: str) -> str:
    prefix = f"{label}: "
    assert piece.startswith(prefix), f"expected {prefix!r}, got {piece!r}"
    return piece[len(prefix):]


def parse_progress_line(line: str) -> ProgressLine:
    """One line of progress.txt (with or without its newline)."""
    pieces = line.rstrip("\n").split("\t")
    assert len(pieces) >= 4, f"a line has at least 4 tab-separated fields: {line!r}"
    stamp = datetime.strptime(pieces[0], STAMP_FORMAT)
    job_id = _labelled(pieces[1], "Job ID")
    num_gpus = int(_labelled(pieces[2], "# GPUs"))
    event = pieces[3]
    parsed = ProgressLine(stamp, job_id, num_gpus, event)
    if event == STARTING_JOB:
        assert len(pieces) == 4, f"'Starting job' has no fields after it: {line!r}"
        return parsed
    assert event == SAVED_CHECKPOINT, f"unknown event {event!r}"
    assert len(pieces) == 4 + len(SAVED_FIELDS), f"fields of a saved checkpoint: {line!r}"
    for piece, (label, spec, unit) in zip(pieces[4:], SAVED_FIELDS):
        text = _labelled(piece, label)
        assert text.endswith(unit), f"{label} must end in {unit!r}: {piece!r}"
        parsed.values[label] = _value(text[:len(text) - len(unit)], spec)
    return parsed


def parse_progress_file(text: str) -> list[ProgressLine]:
    """Every line of a progress.txt file's text (each ends with a newline)."""
    assert text.endswith("\n"), "every line ends with a newline"
    return [parse_progress_line(line) for line in text.splitlines()]
