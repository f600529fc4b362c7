"""The node agent: a Kubernetes GPU node's readings, attributed to the pods that hold them.

On Kubernetes the pool service does not read remote nodes; one agent per GPU node (a
DaemonSet with ``hostPID``: ``hub_config/kubernetes-agent.yaml``) does, and posts what it
read to the pool (``POST api/samples``) with a JupyterHub service token of its own.

What flows in: the node's GPUs (NVML), its processes (``/proc``, host pids), the devices the
kubelet gave each container (its pod-resources socket), and the node's pods (the Kubernetes
API, this node's only: the field selector ``spec.nodeName``).
The steps, every ``sample_interval``:
  1. ``usage/sampler.py`` reads the GPUs: memory, SM utilization, processes (the same code
     as the pool's own sampler on the local backend);
  2. ``cgroup``        each process's pod UID, from ``/proc/<pid>/cgroup``;
  3. ``podresources``  each pod's GPUs, from the kubelet;
  4. ``pods``          each pod's owner, from its labels and annotations: a train job's
                       attempt (and node rank), a notebook server's build slices, or nobody
                       in gpushare;
  5. ``report``        the reading with its claims, bounded in size;
  6. ``app``           posted to the pool; retried with back-off, newest reading first.
What flows out: one ``POST api/samples`` per reading, and a log line per problem. Steps 2
(parsing), 4 and 5 are pure; ``app.py`` does the I/O.
"""
