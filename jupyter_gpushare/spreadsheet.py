"""CSV for spreadsheets: every export (``api/usage?format=csv``, ``dashboard/usage.csv``,
``api/history?format=csv``, ``gpushare usage --format csv``) is written here, so that a cell a
spreadsheet would read as a formula is read as text.

Names come from users (JupyterHub accepts user names such as ``=HYPERLINK(...)`` from
authenticators that let people choose them, and job names are free text); CSV quoting does
not stop Excel, LibreOffice or Google Sheets from evaluating a cell that begins with ``=``,
``+``, ``-`` or ``@`` (or a tab or line break before one). Such a text cell gets a leading
``'``, which spreadsheets take as "this is text" and show without it (OWASP's advice for CSV
injection). Numbers are written as they are: ``-1.5`` is a number, not a formula.
"""

from __future__ import annotations

import csv
import io

# What a spreadsheet may read as the start of a formula: the four signs (their full-width
# forms and the minus sign, which some spreadsheets fold to them), and the blanks and breaks
# they may skip before one (any white space, no-break and ideographic spaces too).
FORMULA_START = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20\u2212")


def cell(value) -> object:
    """``value`` as a CSV cell a spreadsheet shows and never evaluates: None is empty, numbers
    stay numbers, text that could start a formula begins with ``'``."""
    if value is None:
        return ""
    if isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    if text[:1] in FORMULA_START or text.lstrip()[:1] in FORMULA_START:
        return "'" + text
    return text


def to_csv(columns: list[str], rows: list[dict]) -> str:
    """A header of ``columns`` and one line a row (a row's other keys are left out)."""
    out = io.StringIO()
    # CRLF ends a row (RFC 4180), and a cell with either break in it is quoted: with "\n"
    # alone, a name with a bare "\r" went out unquoted, and spreadsheets began a new row at
    # it, whose first cell could be a formula.
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([cell(c) for c in columns])
    for row in rows:
        writer.writerow([cell(row.get(c)) for c in columns])
    return out.getvalue()
