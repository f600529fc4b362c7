"""The pool service killed twice with SIGKILL while two users submit through the real proxy:
every job the API accepted finishes exactly once (marker files per attempt prove it), none is
stuck, and no submit the clients retried made a second job (tests/crashrun.py)."""

import random
import shutil
import tempfile
from pathlib import Path

from crashrun import GROUPS, POOL_CONFIG, crash_under_load
from hubtest import running_hub


def test_two_crashes_under_load_lose_nothing_and_run_nothing_twice(tmp_path):
    markers = Path(tempfile.mkdtemp(prefix="gpushare-markers-"))  # the jobs' users reach it
    try:
        with running_hub(tmp_path, GROUPS, POOL_CONFIG) as hub:
            run = crash_under_load(hub, markers, kills=2, seconds=10.0,
                                   rng=random.Random(13))
    finally:
        shutil.rmtree(markers, ignore_errors=True)
    assert len(run.accepted) >= 20, "too few submits to mean anything"
    assert run.problems == []
    assert len(run.downtimes) == 2 and max(run.downtimes) < 10.0, run.downtimes
