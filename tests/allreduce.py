"""A rank of a tiny distributed program in pure Python, for the tests (no framework is
installed here): every rank meets rank 0 at MASTER_ADDR:MASTER_PORT over TCP, and they
all-reduce (sum) a vector of ``[RANK + 1] * 4``. Each rank prints its view of the gang and
the sum, which is the same on every rank only if the data really travelled.

    python allreduce.py [--fail-rank R [--code C]] [--hold FILE] [--late-rank R S]

``--fail-rank R`` makes rank R exit with C (default 3) after the exchange, the others then
wait (as a real job would, in its next collective) until they are stopped; ``--hold FILE``
makes every rank wait for FILE after the exchange, with a SIGTERM handler that says so;
``--late-rank R S`` makes rank R wait S seconds before it meets the others."""

import json
import os
import signal
import socket
import sys
import time

VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
             "JAX_PROCESS_ID", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
             "CUDA_VISIBLE_DEVICES", "GPUSHARE_NODE_GPUS")


def _send(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _recv(sock):
    def exactly(n):
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            out += chunk
        return out
    return json.loads(exactly(int.from_bytes(exactly(4), "big")))


def all_reduce(vector, rank, world, host, port, timeout=60):
    if world == 1:
        return vector
    if rank == 0:
        with socket.create_server((host, port), reuse_port=False) as server:
            server.settimeout(timeout)
            peers = [server.accept()[0] for _ in range(world - 1)]
        total = list(vector)
        for peer in peers:
            total = [a + b for a, b in zip(total, _recv(peer))]
        for peer in peers:
            _send(peer, total)
            peer.close()
        return total
    deadline = time.monotonic() + timeout
    while True:  # rank 0 may not listen yet
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with sock:
        _send(sock, vector)
        return _recv(sock)


def main(args):
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    seen = {k: env.get(k) for k in VARIABLES}
    said = "stopped" if "--fail-rank" in args else "got SIGTERM"
    signal.signal(signal.SIGTERM, lambda *a: (print(f"rank {rank} {said}", flush=True),
                                              sys.exit(143)))
    if "--late-rank" in args:
        at = args.index("--late-rank")
        if rank == int(args[at + 1]):
            time.sleep(float(args[at + 2]))
    total = all_reduce([rank + 1] * 4, rank, world, env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    print("RANK-REPORT " + json.dumps({"env": seen, "sum": total}), flush=True)
    if "--fail-rank" in args:
        code = int(args[args.index("--code") + 1]) if "--code" in args else 3
        if rank == int(args[args.index("--fail-rank") + 1]):
            print(f"rank {rank} fails", flush=True)
            sys.exit(code)
        time.sleep(120)
        sys.exit(0)
    if "--hold" in args:
        hold = args[args.index("--hold") + 1]
        while not os.path.exists(hold):
            time.sleep(0.05)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
