"""GPU inventory: the simulated stand-in, and NVML failures said in one sentence."""

import logging
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from jupyter_gpushare.gpus import (SIMULATED_NAME, Device, GPUInfo, InventoryError, NVMLInventory,
                                   ProcessMemory, SimulatedInventory, describe, detect,
                                   find_device)
from jupyter_gpushare.notebook.watchdog import process_tree


def one_sentence(text):
    return "\n" not in text and "Traceback" not in text and text[0].isupper() and text.endswith(".")


class MismatchedNVML(NVMLInventory):
    """Bindings that do not match the driver: the error that is not an NVMLError."""

    def _query(self, pynvml):
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML "
                                              "version does not match the NVML lib version")


def test_simulated_gpus_say_what_they_are():
    inventory = SimulatedInventory("sim-node-1", 3)
    assert inventory.source == "simulated" and inventory.node == "sim-node-1"
    assert inventory.gpus() == [GPUInfo(i, f"GPU-SIMULATED-sim-node-1-{i}", SIMULATED_NAME, 0)
                                for i in range(3)]
    assert SIMULATED_NAME == "simulated GPU (no device)"


def test_nvml_says_in_one_sentence_why_there_are_no_gpus():
    inventory = NVMLInventory()
    problem = inventory.problem()
    if problem is None:
        found = inventory.gpus()
        assert found and all(g.uuid.startswith("GPU-") and g.memory_total > 0 for g in found)
        return
    assert one_sentence(problem), problem
    with pytest.raises(InventoryError) as raised:
        inventory.gpus()
    assert str(raised.value) == problem


def test_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    problem = NVMLInventory().problem()
    assert one_sentence(problem) and "pip install nvidia-ml-py" in problem


@pytest.mark.parametrize("code, words", [
    ("NVML_ERROR_LIBRARY_NOT_FOUND", "no NVIDIA driver"),
    ("NVML_ERROR_DRIVER_NOT_LOADED", "not loaded"),
    ("NVML_ERROR_NO_PERMISSION", "may not query"),
    ("NVML_ERROR_UNKNOWN", "could not list"),
])
def test_nvml_errors_become_sentences(code, words):
    pynvml = pytest.importorskip("pynvml")
    sentence = describe(pynvml.NVMLError(getattr(pynvml, code)))
    assert one_sentence(sentence) and words in sentence


def test_library_mismatch_is_caught_though_not_an_nvml_error():
    pynvml = pytest.importorskip("pynvml")
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    problem = MismatchedNVML().problem()
    assert one_sentence(problem) and "does not match the installed NVIDIA driver" in problem


def test_detect_falls_back_to_labelled_simulation_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="jupyter_gpushare.gpus"):
        found = detect(2, 4)
    if found[0].source == "nvml":
        assert len(found) == 1 and found[0].gpus()
        return
    assert [(i.node, i.source, len(i.gpus())) for i in found] == [
        ("sim-node-0", "simulated", 4), ("sim-node-1", "simulated", 4)]
    [record] = [r for r in caplog.records if r.name == "jupyter_gpushare.gpus"]
    assert record.levelno == logging.WARNING and NVMLInventory().problem() in record.getMessage()


# -- sampling: memory, MIG, processes ----------------------------------------------------------

GiB = 2**30


@pytest.fixture
def sleeper():
    """A real child process (and its own child), so that PIDs are real."""
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; "
                             "time.sleep(60)']); time.sleep(60)"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(process_tree(proc.pid)) < 2:
        time.sleep(0.05)
    yield proc
    for pid in process_tree(proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.wait()


def test_simulated_gpus_report_the_memory_of_live_processes(sleeper):
    inventory = SimulatedInventory("sim-build-0", 2, memory_total=16 * GiB)
    uuid = inventory.gpus()[1].uuid
    inventory.set_process_memory(uuid, sleeper.pid, 3 * GiB)
    inventory.set_process_memory(uuid, 1, GiB)
    first, second = inventory.sample()
    assert first.device.processes == () and first.device.memory_used == 0
    assert second.device == Device(uuid, SIMULATED_NAME, 16 * GiB, 4 * GiB,
                                   (ProcessMemory(1, GiB), ProcessMemory(sleeper.pid, 3 * GiB)))
    assert find_device([first, second], uuid) == second.device
    assert find_device([first, second], "GPU-nope") is None
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    # like NVML, a process that has ended is no longer listed
    assert inventory.sample()[1].device.processes == (ProcessMemory(1, GiB),)
    with pytest.raises(InventoryError, match="no simulated GPU GPU-nope"):
        inventory.set_process_memory("GPU-nope", 1, GiB)


def test_nvml_sample_says_why_it_cannot_here():
    inventory = NVMLInventory()
    problem = inventory.problem()
    if problem is None:  # a GPU machine: the sample is consistent with the list
        samples = inventory.sample()
        assert [s.gpu for s in samples] == inventory.gpus()
        assert all(s.device.memory_total == s.gpu.memory_total for s in samples)
        return
    with pytest.raises(InventoryError) as raised:
        inventory.sample()
    assert str(raised.value) == problem


class OneMIGGPU:
    """The few NVML calls of a sample, answered for one GPU with MIG on and two instances in
    slots 0 and 2 (slot 1 empty); the drivers that cannot list processes with _v3 answer
    through _v2. A stand-in for the bindings on a machine without a GPU; the real calls run in
    scripts/gpu_check.py on a GPU machine."""

    def __init__(self, pynvml, mismatch=False):
        self.p, self.mismatch = pynvml, mismatch
        self.NVMLError, self.NVMLLibraryMismatchError = pynvml.NVMLError, \
            pynvml.NVMLLibraryMismatchError
        for name in ("NotFound", "InvalidArgument", "NotSupported"):
            setattr(self, f"NVMLError_{name}", getattr(pynvml, f"NVMLError_{name}"))
        self.NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
        self.nvmlInit = self.nvmlShutdown = lambda: None

    def error(self, name):
        return self.NVMLError(getattr(self.p, name))

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return "gpu"

    def nvmlDeviceGetUUID(self, h):
        return {"gpu": b"GPU-1", "mig0": "MIG-a", "mig2": "MIG-b"}[h]

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100" if h == "gpu" else "NVIDIA H100 MIG 1g.10gb"

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 80 * GiB if h == "gpu" else 10 * GiB
        return types.SimpleNamespace(total=total, used=GiB, free=total - GiB)

    def nvmlDeviceGetUtilizationRates(self, h):
        raise self.error("NVML_ERROR_NOT_SUPPORTED")  # as with MIG on

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i == 1:
            raise self.error("NVML_ERROR_NOT_FOUND")
        return f"mig{i}"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if self.mismatch:
            raise self.NVMLLibraryMismatchError("Unversioned function called")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        proc = types.SimpleNamespace
        return {"gpu": [], "mig0": [proc(pid=7, usedGpuMemory=2 * GiB)],
                "mig2": [proc(pid=8, usedGpuMemory=None)]}[h]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        raise self.error("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=7, usedGpuMemory=GiB)] if h == "mig0" else []


@pytest.mark.parametrize("mismatch", [False, True])
def test_nvml_sample_of_a_mig_gpu(mismatch):
    pynvml = pytest.importorskip("pynvml")
    [sample] = NVMLInventory("n")._sample(OneMIGGPU(pynvml, mismatch))
    assert sample.gpu == GPUInfo(0, "GPU-1", "NVIDIA H100", 80 * GiB)
    assert sample.mig_enabled is True and sample.utilization is None
    assert sample.problems == ("Utilization of GPU 0: This GPU or its driver does not support "
                               "that query.",)
    assert [d.uuid for d in sample.devices()] == ["GPU-1", "MIG-a", "MIG-b"]
    assert sample.mig[0] == Device("MIG-a", "NVIDIA H100 MIG 1g.10gb", 10 * GiB, GiB,
                                   (ProcessMemory(7, 2 * GiB),))
    assert sample.mig[1].processes == (ProcessMemory(8, None),)


class BindingsWithoutFallback(OneMIGGPU):
    """Bindings newer than the driver, with no _v2 call to fall back on."""

    nvmlDeviceGetComputeRunningProcesses_v2 = None

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        raise self.NVMLLibraryMismatchError("Unversioned function called")


def test_a_process_list_that_cannot_be_read_is_a_problem_not_a_failure():
    pynvml = pytest.importorskip("pynvml")
    [sample] = NVMLInventory("n")._sample(BindingsWithoutFallback(pynvml))
    assert sample.mig[0].processes is None and sample.mig[0].memory_total == 10 * GiB
    assert sample.device.processes is None
    mismatch = ("The nvidia-ml-py package does not match the installed NVIDIA driver: install "
                "the nvidia-ml-py version that matches it.")
    assert sample.problems[1:] == tuple(f"Processes on {where}: {mismatch}" for where in (
        "GPU 0", "MIG instance 0 of GPU 0", "MIG instance 2 of GPU 0"))
