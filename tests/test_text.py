"""The words people read about time (text.py): one duration format and one way to say when,
for the %gpushare panel, the CLI and the %%train status line alike (the JupyterLab extension
follows the same); and how other people's words reach a terminal (escaped)."""

import time

import pytest

from jupyter_gpushare.text import clock_time, duration, idle_text, no_jobs, table, visible, when


@pytest.mark.parametrize("seconds, said", [
    (0, "0s"), (0.9, "0s"), (45, "45s"), (59.9, "59s"), (60, "1m"), (70, "1m 10s"),
    (65, "1m 05s"), (1800, "30m"), (3599, "59m 59s"), (3600, "1h"), (7500, "2h 05m"),
    (86399, "23h 59m"), (86400, "1d"), (3 * 86400 + 4 * 3600 + 59, "3d 4h"), (-5, "0s"),
    (None, "-"),
])
def test_durations(seconds, said):
    assert duration(seconds) == said


def test_when_is_relative_within_the_hour_and_by_the_clock_before():
    now = time.time()
    assert when(now, now) == "just now" and when(now - 59, now) == "just now"
    assert when(now - 60, now) == "1 min ago" and when(now - 150, now) == "2 min ago"
    assert when(now - 3599, now) == "59 min ago"
    assert when(now - 3600, now) == clock_time(now - 3600)
    assert when(None, now) == "-"
    today = time.mktime(time.localtime()[:3] + (0, 5, 0, 0, 0, -1))  # 00:05 today, local
    assert clock_time(today) == "00:05"
    yesterday = today - 86400
    assert clock_time(yesterday) == time.strftime("%b %d %H:%M", time.localtime(yesterday))


def test_idle_only_after_five_minutes_in_whole_minutes():
    assert [idle_text(s) for s in (None, 0, 60, 299, 300, 1530, 7500, 3 * 86400)] == [
        "", "", "", "", "idle 5m", "idle 25m", "idle 2h 05m", "idle 3d"]


def test_no_jobs_says_how_to_send_one_unless_a_filter_hid_them():
    assert "%%train" in no_jobs() and "gpushare submit" in no_jobs()
    assert no_jobs(filtered=True) == "no jobs match"


# -- what a terminal may print ------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("\x1b]0;PWNED\x07\x1b[8mhidden", "\\x1b]0;PWNED\\x07\\x1b[8mhidden"),  # retitle, conceal
    ("\u202eevil", "\\u202eevil"), ("a\u2066b\u2069\u200e\u200f\u061c", "a\\u2066b\\u2069"
                                    "\\u200e\\u200f\\u061c"),  # bidirectional controls
    ("\x9b2J\x85", "\\x9b2J\\x85"), ("del\x7f", "del\\x7f"),  # C1 CSI and NEL, DEL
    ("cr\rbs\x08tab\tnl\n\x00", "cr\\x0dbs\\x08tab\\x09nl\\x0a\\x00"), ("\u2028", "\\u2028"),
    ("bert-é 名前 🙂 C:\\x1b", "bert-é 名前 🙂 C:\\x1b"),  # letters, and text that only looks so
])
def test_visible_writes_what_a_terminal_obeys_as_escapes(text, shown):
    assert visible(text) == shown
    assert visible(shown) == shown  # printed twice, escaped once


def test_visible_lines_keeps_the_newlines_and_tables_line_up_escaped():
    assert visible("a\x1b\nb", lines=True) == "a\\x1b\nb"
    assert table(["NAME", "GPUS"], [["\u202eevil", 1], ["bert", 12]], numeric={"GPUS"}) == (
        "NAME        GPUS\n"
        "\\u202eevil     1\n"
        "bert          12")
