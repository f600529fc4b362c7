"""Pure scheduling: a snapshot in, decisions out. No I/O, no clocks, no asyncio."""

from .cycle import CycleResult, Preempt, Start, Wait, cycle
from .decisions import PreemptKind
from .model import (BUILD, GPU, TRAIN, Department, JobState, Node, PolicyConfig, Project, Slice,
                    Snapshot, TrainJob, gpus_text)
from .shares import deserved_shares
from .slices import SliceRefused, place_slice

__all__ = [
    "BUILD", "GPU", "TRAIN", "CycleResult", "Department", "JobState", "Node", "PolicyConfig",
    "Preempt", "PreemptKind", "Project", "Slice", "SliceRefused", "Snapshot", "Start", "TrainJob",
    "Wait", "cycle", "deserved_shares", "gpus_text", "place_slice",
]
