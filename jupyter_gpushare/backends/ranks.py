"""The ranks of a train job and the environment each gets, the same on every backend.

A job placed on several nodes runs as a gang of ranks (``layout``):

- by default **one rank per node** (torchrun-style): the rank sees all of its node's GPUs and
  starts its own workers, e.g. ``torchrun`` with ``--nproc-per-node`` (which it finds in
  ``PET_NPROC_PER_NODE``); JAX's usual one process per host; plain Python.
- with ``per_gpu`` **one rank per GPU**: every GPU of the placement gets its own process, which
  sees all GPUs of its node and picks ``LOCAL_RANK`` (``torch.cuda.set_device(LOCAL_RANK)``).

Nodes are numbered in the order of their names; rank 0 is on the first. Every rank gets the
variables of ``torch.distributed``'s ``env://`` (``rank_env``) and of
``jax.distributed.initialize``; no framework is needed, plain Python can read them too. Their
names are ``trainjob.RANK_VARIABLES``: a job's own ``env`` may not set them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..policy.model import GPU
from ..trainjob import (GROUP_RANK, GROUP_WORLD_SIZE, JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
                        JAX_PROCESS_ID, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
                        NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES, PET_NODE_RANK,
                        PET_NPROC_PER_NODE, RANK, WORLD_SIZE)
from .launcher import process_env

DEFAULT_PORT = 29500  # torch.distributed's own default


@dataclass(frozen=True)
class Rank:
    rank: int  # 0 .. world size - 1
    node: str
    node_rank: int  # the node's number in the gang (torchrun's NODE_RANK, GROUP_RANK)
    local_rank: int  # its number on its node
    local_world_size: int  # ranks on its node
    node_gpus: int  # whole GPUs of its node in the placement


@dataclass(frozen=True)
class Layout:
    """Who is who in one attempt: ``ranks`` in rank order, grouped by node."""

    per_gpu: bool
    nodes: tuple[tuple[str, int], ...]  # (node, GPUs) in node-rank order
    ranks: tuple[Rank, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def on_node(self, node_rank: int) -> tuple[Rank, ...]:
        return tuple(r for r in self.ranks if r.node_rank == node_rank)


def layout(placement: Mapping[str, int], per_gpu: bool = False) -> Layout:
    """The ranks of a placement (node -> milli-GPUs, whole GPUs only)."""
    nodes = tuple((node, milli // GPU) for node, milli in sorted(placement.items()))
    ranks, rank = [], 0
    for node_rank, (node, gpus) in enumerate(nodes):
        count = max(gpus, 1) if per_gpu else 1
        for local in range(count):
            ranks.append(Rank(rank, node, node_rank, local, count, gpus))
            rank += 1
    return Layout(per_gpu, nodes, tuple(ranks))


def world_size(placement: Mapping[str, int], per_gpu: bool = False) -> int:
    return layout(placement, per_gpu).world_size


def rank_env(lay: Layout, rank: Rank, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables of one rank. In a per-GPU job the ranks of a node differ only in
    ``launcher.process_env`` (a pod gets its node's first rank's and the launcher the rest)."""
    first = lay.on_node(rank.node_rank)[0]
    env = {
        MASTER_ADDR: master_addr, MASTER_PORT: str(master_port),
        WORLD_SIZE: str(lay.world_size), RANK: str(first.rank),
        LOCAL_RANK: "0", LOCAL_WORLD_SIZE: str(rank.local_world_size),
        NODE_RANK: str(rank.node_rank), GROUP_RANK: str(rank.node_rank),
        GROUP_WORLD_SIZE: str(len(lay.nodes)),
        JAX_COORDINATOR_ADDRESS: f"{_host(master_addr)}:{master_port}",
        JAX_NUM_PROCESSES: str(lay.world_size), JAX_PROCESS_ID: str(first.rank),
        "GPUSHARE_RANK": str(first.rank), "GPUSHARE_NUM_NODES": str(len(lay.nodes)),
        "GPUSHARE_NODE_GPUS": str(rank.node_gpus),
    }
    if lay.per_gpu:
        env.update(process_env(env, rank.local_rank))
    else:
        # torchrun reads its options from PET_<OPTION>: plain `torchrun train.py` joins the gang
        # with one worker per GPU; options given on its command line win.
        env.update({PET_NNODES: str(len(lay.nodes)), PET_NODE_RANK: str(rank.node_rank),
                    PET_NPROC_PER_NODE: str(max(rank.node_gpus, 1)),
                    PET_MASTER_ADDR: master_addr, PET_MASTER_PORT: str(master_port)})
    return env


def log_name(attempt: int, rank: int) -> str:
    """The file name of one rank's output (rank 0's is the attempt's log, as ever)."""
    return f"{int(attempt)}.log" if rank == 0 else f"{int(attempt)}.rank{int(rank)}.log"


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
