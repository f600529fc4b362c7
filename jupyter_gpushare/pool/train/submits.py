"""Submits: a checked job spec stored once, within the user's cap of waiting jobs.

A spec whose ``request_id`` the user already submitted gets that job back and no second one
is made (the store's unique constraint decides between concurrent tries). Submits still being
written count as waiting: a flood of concurrent ones cannot all pass the cap before the first
is stored. The commit waits for the disk in a worker thread, while the event loop answers
other requests; then the scheduler is woken."""

from __future__ import annotations

from collections import Counter

from ...trainjob import PENDING
from ...validate import Invalid
from ..store.database import Store
from ..store.models import JobRow, ProjectRow
from .scheduler import Scheduler

# ``python -c SOURCE`` would put the working directory first on sys.path, where a module
# planted in a shared folder shadows the standard library: the source runs after it is taken
# off (any Python, unlike -P), as __main__, with sys.argv as -c leaves it.
SOURCE_BOOTSTRAP = ("import sys; del sys.path[0]; "
                    "exec(compile(sys.argv.pop(1), '<string>', 'exec'))")


class JobIntake:
    def __init__(self, store: Store, scheduler: Scheduler, python: str, max_pending: int,
                 max_job_size: int):
        self.store, self.scheduler = store, scheduler
        self.python, self.max_pending, self.max_job_size = python, max_pending, max_job_size
        self.submitting: Counter[str] = Counter()  # submits being stored, by user

    def command_for(self, spec: dict) -> list[str]:
        """The argv a checked job spec runs: its command, or its source run by ``python``
        (with the working folder kept off ``sys.path``)."""
        return spec["command"] or [self.python, "-c", SOURCE_BOOTSTRAP, spec["source"]]

    async def submit(self, user: str, project: ProjectRow, spec: dict) -> tuple[JobRow, bool]:
        """Store a checked job spec; ``(job, created)``. ``Invalid`` (429) beyond the cap."""
        cap = self.max_pending
        if self.store.jobs.state_counts(user).get(PENDING, 0) + self.submitting[user] >= cap:
            raise Invalid(f"you have {cap} jobs waiting, the most one user may; wait for some "
                          f"to start, or cancel some", 429)
        self.submitting[user] += 1
        try:
            row, created = await self.store.in_thread(
                self.store.jobs.add_once,
                None, spec.get("request_id"), user=user, project=project.name,
                name=spec["name"], gpus=spec["gpus"], priority=spec["priority"],
                command=self.command_for(spec), env=spec["env"], workdir=spec.get("workdir"),
                per_gpu=spec.get("per_gpu", False), checkpoint_dir="")
        finally:
            self.submitting[user] -= 1
            if not self.submitting[user]:
                del self.submitting[user]
        if created:
            self.scheduler.wake()
        return row, created
