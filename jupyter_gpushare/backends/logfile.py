"""A job attempt's log on disk, capped: its first part and its latest output are kept, what
lies between is dropped, and readers are told so.

A log is a byte stream cut into segments of ``limit // 4`` bytes. ``BASE`` holds the first
segment (bytes from 0); each later one is ``BASE.<start>``, named by the position of its first
byte in the stream. The writer keeps the first segment and the newest three, deleting older
ones after it has made the next, so a log never holds more than ``limit`` bytes and a reader
never sees a hole it is not told about. ``read(base, offset, size)`` returns ``(start,
data)``: ``start`` is past ``offset`` where the bytes at ``offset`` were dropped.

Standard library only: the local backend's shim (run by path, as root) writes with it.
"""

from __future__ import annotations

import glob
import os
import re

SEGMENTS = 4  # kept at most: the first and the newest three
MIN_SEGMENT = 4096
READ_CHUNK = 1 << 20  # what one read returns at most
_LATER = re.compile(r"\.(\d+)\Z")


def segment_size(limit: int) -> int:
    return max(limit // SEGMENTS, MIN_SEGMENT)


class CappedLog:
    """Appends to the log at ``base``, keeping at most ``limit`` bytes. A log already there
    (this attempt's writer restarted) is started again from nothing."""

    def __init__(self, base: str, limit: int, fresh: bool = True):
        self.base, self.segment = base, segment_size(limit)
        if fresh:
            remove(base)
        else:
            for _, path in _later(base):  # the first segment may hold a start-up message
                os.unlink(path)
        self._fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o600)
        self.position = os.fstat(self._fd).st_size  # of the next byte in the stream
        self._start = 0  # of the segment being written
        self._kept: list[str] = []  # later segments, oldest first

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self._start + self.segment - self.position
            if room <= 0:
                self._next_segment()
                continue
            done = os.write(self._fd, view[:room])
            self.position += done
            view = view[done:]

    def _next_segment(self) -> None:
        path = f"{self.base}.{self.position}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        os.close(self._fd)
        self._fd, self._start = fd, self.position
        self._kept.append(path)
        while len(self._kept) > SEGMENTS - 1:
            try:
                os.unlink(self._kept.pop(0))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _later(base: str) -> list[tuple[int, str]]:
    found = []
    for path in glob.glob(glob.escape(base) + ".*"):
        m = _LATER.search(path[len(base):])
        if m and path[len(base):] == m.group(0):
            found.append((int(m.group(1)), path))
    return sorted(found)


def segments(base: str) -> list[tuple[int, str]]:
    """The kept segments as ``(start, path)``, in stream order."""
    first = [(0, base)] if os.path.exists(base) else []
    return first + _later(base)


def read(base: str, offset: int = 0, size: int = READ_CHUNK) -> tuple[int, bytes]:
    """At most ``size`` bytes of the log from ``offset``, as ``(start, data)``: ``start`` is
    the first kept position at or after ``offset`` (later where output was dropped)."""
    for _ in range(5):  # a segment may be deleted between listing and opening: list again
        try:
            return _read(base, offset, size)
        except FileNotFoundError:
            continue
    return offset, b""


def _read(base: str, offset: int, size: int) -> tuple[int, bytes]:
    for start, path in segments(base):
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            if offset < start:  # dropped: go on from the first kept byte after it
                return start, f.read(min(size, length))
            if offset < start + length:
                f.seek(offset - start)
                return offset, f.read(min(size, start + length - offset))
    return offset, b""


def append(base: str, data: bytes) -> None:
    """A few words after whatever the log holds (at the end of its newest segment)."""
    kept = segments(base)
    fd = os.open(kept[-1][1] if kept else base,
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def dropped_note(count: int) -> bytes:
    """What a reader is shown where ``count`` bytes were dropped."""
    return (f"\n[gpushare: {count} bytes of output were dropped here; a log keeps its "
            f"beginning and its latest output]\n").encode()


def remove(base: str) -> None:
    for _, path in segments(base):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
