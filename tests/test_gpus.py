"""GPU inventory: the simulated stand-in, and NVML failures said in one sentence."""

import logging
import sys

import pytest

from jupyter_gpushare.gpus import (SIMULATED_NAME, GPUInfo, InventoryError, NVMLInventory,
                                   SimulatedInventory, describe, detect)


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
