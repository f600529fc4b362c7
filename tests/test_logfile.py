"""A job's log on disk (backends/logfile.py): at most its limit, its beginning and its newest
output kept, and readers told exactly what was dropped, also while it is written."""

import os

from jupyter_gpushare.backends import logfile


def lines(first, last):
    return b"".join(b"%06d\n" % i for i in range(first, last))


def read_all(base, offset=0, size=1000):
    """Everything a follower reading in small chunks gets: (data, dropped byte count)."""
    parts, dropped = [], 0
    while True:
        start, data = logfile.read(base, offset, size)
        dropped += start - offset
        if not data:
            return b"".join(parts), dropped
        parts.append(data)
        offset = start + len(data)


def test_a_small_log_is_kept_whole(tmp_path):
    base = str(tmp_path / "1.log")
    log = logfile.CappedLog(base, 64 * 1024)
    log.write(lines(0, 100))
    log.close()
    assert read_all(base) == (lines(0, 100), 0)
    assert logfile.read(base, 7, 7) == (7, b"000001\n")
    assert [p for _, p in logfile.segments(base)] == [base]


def test_an_endless_log_keeps_its_beginning_and_newest_output(tmp_path):
    base, limit = str(tmp_path / "1.log"), 16 * 4096
    log = logfile.CappedLog(base, limit)
    for i in range(0, 100_000, 1000):  # 700 KB in pieces that straddle segment ends
        log.write(lines(i, i + 1000))
    log.close()
    on_disk = sum(os.path.getsize(p) for _, p in logfile.segments(base))
    assert on_disk <= limit and len(logfile.segments(base)) == logfile.SEGMENTS
    data, dropped = read_all(base)
    whole = lines(0, 100_000)
    head = logfile.segment_size(limit)
    assert data[:head] == whole[:head]  # the first quarter
    assert whole.endswith(data[head:])  # and the newest output, in order
    assert len(data) + dropped == len(whole)


def test_a_follower_is_told_what_was_dropped_while_it_lagged(tmp_path):
    base = str(tmp_path / "1.log")
    log = logfile.CappedLog(base, 4 * 4096)
    log.write(lines(0, 500))  # 3500 bytes: the first segment, not full
    start, data = logfile.read(base, 0)
    offset = start + len(data)
    log.write(lines(500, 5000))  # the follower falls behind by more than the limit
    start, data = logfile.read(base, offset)
    assert start == offset and data  # the rest of the first segment (the beginning is kept)
    offset = start + len(data)
    start, data = logfile.read(base, offset)
    assert start > offset and data  # then a jump to the oldest kept byte, by so much
    assert lines(0, 5000)[start:start + len(data)] == data
    log.close()


def test_a_restarted_writer_starts_again(tmp_path):
    base = str(tmp_path / "1.log")
    log = logfile.CappedLog(base, 4 * 4096)
    log.write(lines(0, 5000))
    log.close()
    again = logfile.CappedLog(base, 4 * 4096)  # e.g. a broken log stream followed anew
    again.write(b"from the start\n")
    again.close()
    assert read_all(base) == (b"from the start\n", 0)
    assert logfile.dropped_note(10) == (b"\n[gpushare: 10 bytes of output were dropped here; "
                                        b"a log keeps its beginning and its latest output]\n")


def test_a_note_goes_after_the_newest_output_and_keeps_the_rest(tmp_path):
    base = str(tmp_path / "1.log")
    log = logfile.CappedLog(base, limit=4 * logfile.MIN_SEGMENT)
    log.write(b"x" * (3 * logfile.MIN_SEGMENT))  # three segments
    log.close()
    before = [path for _, path in logfile.segments(base)]
    logfile.append(base, b"[a note]\n")
    assert [path for _, path in logfile.segments(base)] == before  # nothing dropped
    data, dropped = read_all(base)
    assert dropped == 0 and data.endswith(b"x[a note]\n")
    assert len(data) == 3 * logfile.MIN_SEGMENT + len(b"[a note]\n")
    missing = str(tmp_path / "2.log")
    logfile.append(missing, b"only a note\n")  # no log yet: the note alone
    assert read_all(missing) == (b"only a note\n", 0)
    assert os.stat(missing).st_mode & 0o777 == 0o600
