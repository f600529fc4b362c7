"""Reading GPUs: the NVML stand-in plays its script behind nvidia-ml-py's interface, and the real
sampler reads it (and real NVML, where there is one) without ever raising; attribution of
processes to jobs and slices, on paper and with real processes."""

import os
import signal
import subprocess
import sys
import time

import pynvml
import pytest

from jupyter_gpushare.usage.attribution import GPUUse, Holding, Owner, attribute
from jupyter_gpushare.usage.nvml_standin import NVMLStandIn, write_script
from jupyter_gpushare.usage.procs import LocalOwners
from jupyter_gpushare.usage.sampler import GPUReading, MachineReading, NVMLSampler, ProcessReading

GiB = 2**30


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def one_sentence(text):
    return "\n" not in text and "Traceback" not in text and text[0].isupper() and text.endswith(".")


def standin(script, clock):
    return NVMLStandIn(dict({"start": clock.t, "live_only": False}, **script), clock=clock)


# -- the stand-in ------------------------------------------------------------------------------

def test_the_standin_raises_nvidia_ml_pys_own_errors():
    clock = Clock()
    nvml = standin({"gpus": [{"uuid": "GPU-a", "lost_at": 10}, {"uuid": "GPU-m", "mig": [
        {"uuid": "MIG-1", "memory_total": 10 * GiB}]}]}, clock)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    a, m = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing ran kernels
        nvml.nvmlDeviceGetProcessUtilization(a, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG on
        nvml.nvmlDeviceGetUtilizationRates(m)
    assert nvml.nvmlDeviceGetMigMode(m)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no MIG on this one
        nvml.nvmlDeviceGetMigMode(a)
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(m, 0)) == "MIG-1"
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(m, 1)
    clock.t += 10
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(a)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        standin({"library": False}, clock).nvmlInit()


def test_the_standin_plays_utilization_over_time():
    clock = Clock()
    nvml = standin({"time_scale": 60, "gpus": [{"uuid": "GPU-a"}], "processes": [
        {"pid": 11, "gpu": "GPU-a", "sm": [[0, 90], [120, 10]], "memory": 3 * GiB},
        {"pid": 12, "gpu": "GPU-a", "sm": 5, "memory": GiB, "from": 60}]}, clock)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceGetUtilizationRates(h)
    clock.t += 1  # 60 script seconds: only pid 11 runs
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 90
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [11, 12]
    assert nvml.nvmlDeviceGetMemoryInfo(h).used == 4 * GiB
    seen = int(clock.t * 1e6)  # the driver's clock, in microseconds
    clock.t += 2  # script 60 → 180: pid 11 at 90 for 60 s and 10 for 60 s; pid 12 at 5
    samples = {s.pid: s.smUtil for s in nvml.nvmlDeviceGetProcessUtilization(h, seen)}
    assert samples == {11: 50, 12: 5}
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 55


def test_the_standin_reads_its_script_again_when_it_changes(tmp_path):
    path = tmp_path / "script.json"
    clock = Clock()
    nvml = NVMLStandIn(str(path), clock=clock, default_gpus=[{"uuid": "GPU-x"}, {"uuid": "GPU-y"}])
    nvml.nvmlInit()  # no script yet: the default GPUs, nothing on them
    assert nvml.nvmlDeviceGetCount() == 2
    write_script(path, {"start": clock.t, "live_only": False,
                        "gpus": [{"uuid": "GPU-y", "memory_total": 16 * GiB}],
                        "processes": [{"pid": 5, "gpu": "GPU-y", "memory": GiB}]})
    assert nvml.nvmlDeviceGetCount() == 2  # the script changes a default GPU, adds none
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMemoryInfo(h).total == 16 * GiB
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [5]


# -- the sampler -------------------------------------------------------------------------------

def test_the_sampler_reads_processes_and_their_share_since_the_last_reading():
    clock = Clock()
    nvml = standin({"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}], "processes": [
        {"pid": 21, "gpu": "GPU-a", "sm": [[0, 80], [10, 20]], "memory": 2 * GiB},
        {"pid": 22, "gpu": "GPU-b", "sm": 0, "memory": GiB}]}, clock)
    sampler = NVMLSampler("node-1", nvml, clock=clock)
    clock.t += 5
    first = sampler.read()
    assert first.problem == "" and [g.uuid for g in first.gpus] == ["GPU-a", "GPU-b"]
    a, b = first.gpus
    assert a.processes == (ProcessReading(21, 2 * GiB, 80.0),) and a.utilization == 80.0
    assert b.processes == (ProcessReading(22, GiB, 0.0),)  # NotFound: none ran kernels
    assert a.memory_used == 2 * GiB and a.memory_total == 80 * GiB and a.note == ""
    clock.t += 10  # 5 s at 80, 5 s at 20
    a = sampler.read().gpus[0]
    assert a.processes[0].sm == 50.0 and a.utilization == 50.0


def test_mig_a_lost_gpu_and_a_missing_library_are_sentences_not_failures():
    clock = Clock()
    nvml = standin({"gpus": [
        {"uuid": "GPU-m", "mig": [{"uuid": "MIG-1", "memory_total": 10 * GiB}]},
        {"uuid": "GPU-l", "lost_at": 3}], "processes": [
        {"pid": 31, "gpu": "MIG-1", "sm": 70, "memory": GiB}]}, clock)
    sampler = NVMLSampler("node-2", nvml, clock=clock)
    clock.t += 5
    mig, lost = sampler.read().gpus
    assert mig.utilization is None and mig.processes == ()
    assert mig.mig[0].processes == (ProcessReading(31, GiB, None),)
    assert mig.note == ("GPU 0 of node-2 has MIG on: utilization not available on MIG; memory "
                        "is reported.")
    assert lost.lost and lost.uuid == "lost-node-2-1" and one_sentence(lost.note)
    assert "fallen off the bus" in lost.note
    nvml.script["library"] = False
    nvml._library = False
    sampler._ready = False  # as after a driver unload: init again
    gone = sampler.read()
    assert gone.gpus == () and one_sentence(gone.problem) and "no NVIDIA driver" in gone.problem
    nvml._library = True
    assert len(sampler.read().gpus) == 2  # back again


def test_the_same_sampler_on_real_nvml_says_why_it_cannot_read(monkeypatch):
    reading = NVMLSampler("here").read()
    if not reading.problem:  # a GPU machine: real readings
        assert reading.gpus and all(g.uuid.startswith("GPU-") for g in reading.gpus)
        return
    assert reading.gpus == () and one_sentence(reading.problem)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    missing = NVMLSampler("here").read()
    assert "pip install nvidia-ml-py" in missing.problem


# -- attribution -------------------------------------------------------------------------------

ALICE = Owner("slice", "s-1", "alice")
BOB = Owner("slice", "s-2", "bob")
JOB = Owner("job", "j-1/1", "carol", "vision", "j-1")


def reading(*gpus):
    return MachineReading("n0", 0.0, tuple(gpus))


def test_a_shared_gpu_is_split_by_process_and_strangers_are_named():
    gpu = GPUReading(0, "GPU-s", memory_total=80 * GiB, memory_used=20 * GiB, utilization=40.0,
                     processes=(ProcessReading(1, 4 * GiB, 20.0), ProcessReading(2, 2 * GiB, 5.0),
                                ProcessReading(3, 11 * GiB, 15.0), ProcessReading(4, GiB, 0.0)))
    owners = {1: ALICE, 2: ALICE, 3: None, 4: JOB}
    [use] = attribute(reading(gpu), {"GPU-s": [Holding(ALICE, 250), Holding(BOB, 250)]},
                      {p: o for p, o in owners.items() if o}, {"GPU-s": "build"})
    assert [(u.owner, u.sm, u.memory, u.processes) for u in use.holders] == [
        (ALICE, 25.0, 6 * GiB, 2), (BOB, 0.0, 0, 0)]
    assert use.held == 500 and use.pool == "build"
    assert (use.outside.processes, use.outside.memory, use.outside.sm) == (1, 11 * GiB, 15.0)
    assert use.misplaced.processes == 1
    assert "GPU 0 of n0: 1 process outside gpushare, 11 GiB." in use.notes


def test_without_per_process_figures_a_gpu_is_its_holders_only_when_nobody_else_is_there():
    procs = (ProcessReading(1, GiB, None),)
    whole = GPUReading(0, "GPU-w", utilization=70.0, processes=procs)
    [use] = attribute(reading(whole), {"GPU-w": [Holding(JOB, 1000)]}, {1: JOB}, {})
    assert use.holders[0].sm == 70.0
    shared = GPUReading(1, "GPU-x", utilization=70.0, processes=procs + (
        ProcessReading(2, GiB, None),))
    [use] = attribute(reading(shared), {"GPU-x": [Holding(ALICE, 250), Holding(BOB, 250)]},
                      {1: ALICE, 2: BOB}, {})
    assert [u.sm for u in use.holders] == [None, None]  # cannot tell: never guessed
    mig = GPUReading(2, "GPU-m", utilization=None, mig=(GPUReading(0, "MIG-1", processes=procs),))
    [use] = attribute(reading(mig), {"GPU-m": [Holding(JOB, 1000)]}, {1: JOB}, {})
    assert use.holders[0].sm is None and use.holders[0].memory == GiB
    lost = GPUReading(3, "GPU-l", lost=True, note="GPU 3 is lost.")
    [use] = attribute(reading(lost), {"GPU-l": [Holding(JOB, 1000)]}, {}, {})
    assert use.lost and use.holders[0].sm is None and use.notes == ("GPU 3 is lost.",)


# -- whose process: /proc ----------------------------------------------------------------------

def spawn(code, **kw):
    return subprocess.Popen([sys.executable, "-c", code], **kw)


def test_processes_belong_to_a_jobs_session_or_under_a_notebook_server():
    sleep = "import time; time.sleep(60)"
    job = spawn(f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                f"{sleep!r}]); time.sleep(60)", start_new_session=True)
    server = spawn(f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                   f"{sleep!r}]); time.sleep(60)")
    stranger = spawn(sleep, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = {p: _children(p) for p in (job.pid, server.pid)}
            if all(kids.values()):
                break
            time.sleep(0.05)
        job_kid, server_kid = kids[job.pid][0], kids[server.pid][0]
        owners = LocalOwners()
        found = owners.owners([job_kid, server_kid, stranger.pid, 999_999_999],
                              jobs={job.pid: JOB}, servers={server.pid: ALICE})
        assert found == {job_kid: JOB, server_kid: ALICE}
        # The answer is kept, and dropped when the jobs change.
        assert owners.owners([job_kid], jobs={job.pid: JOB}, servers={}) == {job_kid: JOB}
        assert owners.owners([job_kid], jobs={}, servers={}) == {}
    finally:
        for proc in (job, server, stranger):
            os.killpg(proc.pid, signal.SIGKILL) if proc is not server else _kill_tree(proc.pid)
            proc.wait()


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _kill_tree(pid):
    for kid in _children(pid):
        os.kill(kid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def test_gpu_use_types_are_plain_values():
    assert GPUUse.__dataclass_params__.frozen
