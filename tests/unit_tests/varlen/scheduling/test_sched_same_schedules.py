"""Same schedules as 09db11f: every scheduler's schedule of every problem of the ``suite``
corpus (tools/scheduling/schedule_corpus.py: 1,000 random problems full of ties, budget stops,
mixed group sizes, SP, PP and VPP counts under five cost models, and the benchmark workloads
at 8, 64 and 1,024 ranks) hashes to the fingerprint recorded from 09db11f.

This is the gate a refactor or a future fast path passes: behind the same signature, the very
same schedules. Re-record (``--record``) only for an intended change of schedules, and say
why in the commit; ``--compare TREE`` lists the problems that differ from another tree."""

import json
from pathlib import Path

from tools.scheduling.schedule_corpus import fingerprints

RECORDED = Path(__file__).parent / "data" / "schedule_fingerprints.json"


def test_every_schedule_of_the_corpus_is_the_recorded_one():
    recorded = json.loads(RECORDED.read_text())
    current = fingerprints("suite")
    assert current.keys() == recorded.keys()
    differ = sorted(key for key in current if current[key] != recorded[key])
    assert differ == [], f"{len(differ)} schedules changed, e.g. {differ[:10]}"
