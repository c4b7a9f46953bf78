"""One line of a JSONL input (SFT data, ``tools/preprocess_data.py``), bytes to text.

Files are read as bytes so that a bad byte is reported with its line. A UTF-8 byte order mark
(what Windows editors and some exporters put at the start of a file) is dropped from the first
line: ``json.loads`` refuses it, and it is no part of the first record.
"""

from __future__ import annotations

import codecs

FIRST_LINE = 1


def decode_line(where: str, line_number: int, raw: bytes) -> str:
    """The text of line ``line_number`` (1-based) of a UTF-8 file, without the first line's
    byte order mark; a ValueError starting with ``where`` (``file:line``) names a bad byte."""
    if line_number == FIRST_LINE and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte "
                         f"offset {err.start} of the line)") from None
