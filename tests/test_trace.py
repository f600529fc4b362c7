"""Trace and quota files: every problem names the file, the line and what to fix."""

import gzip

import pytest

from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.sim.trace import (TraceError, apportion, proportional_quotas, read_quotas,
                                        read_trace)

HEADER = "job_id,submit_time,duration,gpus,project\n"


def write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("body, line, words", [
    ("a,0,10,1\n", 2, "fields"),
    ("a,0,-5,1,p\n", 2, "duration must be more than 0"),
    ("a,0,10,abc,p\n", 2, "gpus must be a number, not 'abc'"),
    ("a,0,10,1.5,p\n", 2, "whole number for a train job"),
    ("a,0,10,0,p\n", 2, "gpus must be positive"),
    ("a,x,10,1,p\n", 2, "submit_time must be a number"),
    ("a,0,nan,1,p\n", 2, "finite"),
    ("a,0,10,1,p\na,5,10,1,p\n", 3, "appears twice"),
    ("a,0,10,1,\n", 2, "project is empty"),
], ids=["short-row", "negative-duration", "non-numeric-gpus", "fraction-for-train",
        "zero-gpus", "bad-submit", "nan-duration", "duplicate-id", "no-project"])
def test_bad_rows_name_file_line_and_reason(tmp_path, body, line, words):
    path = write(tmp_path, HEADER + body)
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert str(e.value).startswith(f"{path}, line {line}: ")
    assert words in str(e.value)


def test_missing_column_is_named(tmp_path):
    path = write(tmp_path, "job_id,submit_time,gpus,project\na,0,1,p\n")
    with pytest.raises(TraceError, match=r"line 1: the header lacks column\(s\) duration"):
        read_trace(path)


def test_missing_file_and_empty_trace(tmp_path):
    with pytest.raises(TraceError, match="cannot be read"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="has no jobs"):
        read_trace(write(tmp_path, HEADER))


def test_gzip_and_optional_columns(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(
        b"job_id,submit_time,duration,gpus,project,user,priority,kind\n"
        b"a,0,10,2,p,ann,3,train\nb,1,10,0.25,p,bob,,build\n"))
    a, b = read_trace(path)
    assert (a.gpus, a.user, a.priority, a.kind, a.line) == (2 * GPU, "ann", 3, "train", 2)
    assert (b.gpus, b.kind, b.priority) == (250, "build", 0)


def test_quotas_file(tmp_path):
    assert read_quotas(write(tmp_path, "project,quota\na,2\nb,0.5\n")) == {"a": 2000, "b": 500}
    with pytest.raises(TraceError, match="line 2: quota must be 0 or more"):
        read_quotas(write(tmp_path, "project,quota\na,-1\n"))
    with pytest.raises(TraceError, match="header must be project,quota"):
        read_quotas(write(tmp_path, "name,gpus\na,1\n"))


def test_apportion_sums_exactly_in_whole_gpus():
    quotas = apportion({"a": 512, "b": 256, "c": 128, "d": 0}, 100)
    assert sum(quotas.values()) == 100 * GPU
    assert all(q % GPU == 0 for q in quotas.values())
    assert quotas["a"] > quotas["b"] > quotas["c"] > quotas["d"] == 0


def test_proportional_quotas_follow_gpu_hours(example):
    jobs = read_trace(example[0])
    quotas = proportional_quotas(jobs, 32)
    assert sum(quotas.values()) == 32 * GPU
    hours = {p: sum(j.gpus * j.duration for j in jobs if j.project == p) for p in quotas}
    assert max(hours, key=hours.get) == max(quotas, key=quotas.get)
