"""The build slice from the environment, and the watchdog over this process tree's GPU memory,
on the simulated inventory with real PIDs."""

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from jupyter_gpushare.gpus import (Device, GPUSample, InventoryError, ProcessMemory,
                                   SimulatedInventory)
from jupyter_gpushare.notebook.watchdog import BuildSlice, SliceWatchdog, process_tree

GiB = 2**30


@pytest.fixture
def kernel():
    """A real child of this test process with a child of its own, like a kernel and what it
    started."""
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; "
                             "time.sleep(60)']); time.sleep(60)"])
    deadline = time.monotonic() + 10
    while len(process_tree(proc.pid)) < 2:
        assert time.monotonic() < deadline, "the child's child did not start"
        time.sleep(0.05)
    yield proc
    for pid in process_tree(proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.wait()


def test_process_tree_has_the_root_and_every_descendant(kernel):
    tree = process_tree(os.getpid())
    [grandchild] = set(process_tree(kernel.pid)) - {kernel.pid}
    assert {os.getpid(), kernel.pid, grandchild} <= set(tree)
    assert tree[kernel.pid].startswith("python") and 1 not in tree
    assert process_tree(kernel.pid) == {kernel.pid: tree[kernel.pid],
                                        grandchild: tree[grandchild]}
    assert process_tree(2**22 + 1) == {}  # beyond Linux's largest PID


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"GPUSHARE_SLICE_GPUS": " "}, None),
    ({"GPUSHARE_SLICE_GPUS": "0", "GPUSHARE_SLICE_MODE": "cpu"}, None),
    ({"GPUSHARE_SLICE_GPUS": "0.25"}, BuildSlice(0.25)),
    ({"GPUSHARE_SLICE_GPUS": "0.5", "GPUSHARE_SLICE_UUID": "GPU-x",
      "GPUSHARE_SLICE_MODE": "pinned"}, BuildSlice(0.5, "GPU-x", "pinned")),
    ({"GPUSHARE_SLICE_GPUS": "2", "GPUSHARE_SLICE_UUID": "GPU-x,GPU-y",
      "GPUSHARE_SLICE_MODE": "exclusive"}, BuildSlice(2.0, "GPU-x,GPU-y", "exclusive")),
])
def test_the_slice_comes_from_the_spawners_environment(env, expected):
    assert BuildSlice.from_environment(env) == expected


def test_the_spawners_own_variables_read_back():
    modes = pytest.importorskip("jupyter_gpushare.spawner.modes")
    assert BuildSlice.from_environment(modes.slice_env("pinned", 250, "GPU-a")) == \
        BuildSlice(0.25, "GPU-a", "pinned")
    assert BuildSlice.from_environment(modes.slice_env("timeslice", 500)) == \
        BuildSlice(0.5, None, "timeslice")
    assert BuildSlice.from_environment(modes.cpu_only().env) is None


@pytest.mark.parametrize("value", ["abc", "-0.5", "inf", "nan"])
def test_a_slice_that_is_not_a_number_of_gpus_is_one_sentence(value):
    with pytest.raises(ValueError) as raised:
        BuildSlice.from_environment({"GPUSHARE_SLICE_GPUS": value})
    assert str(raised.value) == (f"GPUSHARE_SLICE_GPUS must be a number of GPUs like 0.25, not "
                                 f"{value!r}; the spawner sets it")


def test_slice_labels_and_what_the_watchdog_leaves_alone():
    assert [BuildSlice(f).label for f in (0.25, 0.5, 1.0, 0.3, 2.0)] == \
        ["¼ GPU", "½ GPU", "1 GPU", "0.3 GPU", "2 GPUs"]
    assert BuildSlice(0.25, mode="timeslice").unwatched() is None
    assert BuildSlice(0.25, mode="pinned").unwatched() is None
    assert "hardware" in BuildSlice(0.25, mode="mig").unwatched()
    assert "HAMi" in BuildSlice(0.25, mode="hami").unwatched()
    assert BuildSlice(2.0, mode="exclusive").unwatched() == \
        "This server holds 2 GPUs whole, so there is no slice to overrun."


def test_watchdog_warns_once_when_the_tree_crosses_the_slice_and_says_when_back(kernel, caplog):
    inventory = SimulatedInventory("sim-build-0", 2, memory_total=16 * GiB)
    gpu = inventory.gpus()[1].uuid
    [grandchild] = set(process_tree(kernel.pid)) - {kernel.pid}
    watchdog = SliceWatchdog(inventory, BuildSlice(0.25, gpu), root_pid=os.getpid(),
                             log=logging.getLogger("test.watchdog"), clock=lambda: 1000.0)
    inventory.set_process_memory(gpu, kernel.pid, 1 * GiB)
    inventory.set_process_memory(gpu, 1, 12 * GiB)  # someone else's process: not counted
    with caplog.at_level(logging.INFO, logger="test.watchdog"):
        report = watchdog.check()
        assert report == {
            "at": 1000.0, "slice": {"gpus": 0.25, "uuid": gpu, "mode": None, "label": "¼ GPU"},
            "device": {"uuid": gpu, "name": "simulated GPU (no device)",
                       "memory_total": 16 * GiB, "mig": False},
            "limit": 4 * GiB, "used": GiB, "others": 12 * GiB, "unattributed": 0,
            "processes": [{"pid": kernel.pid, "name": process_tree(kernel.pid)[kernel.pid],
                           "used": GiB}],
            "over": False, "problem": None,
            "message": "This server's processes use 1.0 GiB of the slice's 4.0 GiB "
                       "(¼ GPU of simulated GPU (no device))."}
        assert caplog.records == []
        # the kernel's child allocates: the tree is over its slice
        inventory.set_process_memory(gpu, grandchild, 3.5 * GiB)
        report = watchdog.check()
        assert report["over"] and report["used"] == 4.5 * GiB
        assert report["message"] == (
            "This server's processes use 4.5 GiB of GPU memory, more than the slice's 4.0 GiB "
            "(¼ GPU of simulated GPU (no device)): free memory (restart a kernel, delete "
            "tensors) or send the work to the train pool with %%train.")
        assert watchdog.check()["over"] and watchdog.latest["used"] == 4.5 * GiB
        [warning] = caplog.records
        assert warning.levelno == logging.WARNING and warning.getMessage() == report["message"]
        # the child ends (its memory with it): back within the slice, said once
        os.kill(grandchild, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while watchdog.check()["over"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        watchdog.check()
    assert [(r.levelno, r.getMessage()) for r in caplog.records[1:]] == [
        (logging.INFO, "This server's processes use 1.0 GiB of the slice's 4.0 GiB "
                       "(¼ GPU of simulated GPU (no device)).")]


class HostPIDs(SimulatedInventory):
    """What a container sees: NVML lists host PIDs that do not exist in its PID namespace."""

    def sample(self):
        gpu = self.gpus()[0]
        procs = (ProcessMemory(2**22 + 7, 5 * GiB),)
        return [GPUSample(gpu, Device(gpu.uuid, gpu.name, gpu.memory_total, 5 * GiB, procs))]


def test_host_pids_it_cannot_see_are_reported_not_guessed():
    inventory = HostPIDs("pod", 1, memory_total=8 * GiB)
    report = SliceWatchdog(inventory, BuildSlice(0.5), os.getpid()).check()
    assert not report["over"] and report["unattributed"] == 1 and report["used"] == 0
    assert report["message"] == (
        "This server's processes use 0.0 GiB of the slice's 4.0 GiB (½ GPU of simulated GPU "
        "(no device)). NVML lists 1 processes whose PIDs are not visible here (host PIDs in a "
        "container), so their memory is not counted.")


class NoNVML(SimulatedInventory):
    def sample(self):
        raise InventoryError("The NVIDIA driver is not loaded on this machine: it has no GPU, "
                             "or the kernel module failed to load.")


@pytest.mark.parametrize("inventory, build_slice, problem", [
    (NoNVML("n", 1), BuildSlice(0.25), "the NVIDIA driver is not loaded on this machine: it "
     "has no GPU, or the kernel module failed to load."),
    (SimulatedInventory("n", 2, GiB), BuildSlice(0.25, "GPU-elsewhere"),
     "the slice's GPU GPU-elsewhere is not among the 2 GPUs NVML lists here."),
    (SimulatedInventory("n", 2, GiB), BuildSlice(0.25), "the slice's GPU is not named "
     "(GPUSHARE_SLICE_UUID is not set) and NVML lists 2 GPUs here, so the watchdog cannot "
     "tell which is the slice's."),
    (SimulatedInventory("n", 1), BuildSlice(0.25), "the slice's GPU (simulated GPU (no "
     "device)) reports no memory, so there is nothing to compare with."),
])
def test_what_the_watchdog_cannot_check_is_one_sentence(inventory, build_slice, problem, caplog):
    watchdog = SliceWatchdog(inventory, build_slice, os.getpid())
    report = watchdog.check()
    assert not report["over"] and report["problem"]
    assert report["message"] == f"The slice watchdog cannot check this server's GPU memory: " \
                                f"{problem}"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_only_gpu_is_the_slices_when_the_spawner_could_not_name_it(kernel):
    inventory = SimulatedInventory("pod", 1, memory_total=8 * GiB)
    inventory.set_process_memory(inventory.gpus()[0].uuid, kernel.pid, 5 * GiB)
    report = SliceWatchdog(inventory, BuildSlice(0.5), os.getpid()).check()
    assert report["over"] and report["limit"] == 4 * GiB
