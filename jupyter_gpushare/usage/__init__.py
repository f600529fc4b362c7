"""What the GPUs do, measured and attributed: utilization beside allocation.

The pipeline, each step in its own module:
  1. sampler      one reading of a machine's GPUs through NVML (or ``nvml_standin``, its
                  scripted stand-in on machines without a GPU): memory, SM utilization,
                  processes and their share
  2. procs        whose each process is on this machine: a job attempt's session, or a
                  notebook server's process tree (reads /proc)
  3. attribution  each GPU's holders (job attempts, build slices) with their use
  4. rollup       sums per GPU, pool, project, job attempt and slice per time bucket; the
                  definitions of allocation, utilization and idle-allocated
  5. meter        the pool service's loop: readings in, rows to the store, the live view
  6. report       ``api/usage``'s answer from the sums
and ``cull``: which idle build sessions to warn and stop; ``showback``: calendar periods and
the rows of ``gpushare usage --step``. Steps 3, 4 and 6, ``cull`` and
``showback`` are pure; the pool service wires them (``pool/utilization/service.py``).
"""
