"""The tables of the pool service's store. GPU amounts are integer milli-GPUs here too.

Every change to these models comes with an alembic migration (``pool/store/migrations``); a test
checks that the migrations build exactly these tables.
"""

from __future__ import annotations

from sqlalchemy import (JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String,
                        Text, UniqueConstraint, false)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ...policy.decisions import PreemptKind


class Base(DeclarativeBase):
    pass


class ProjectRow(Base):
    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    quota: Mapped[int] = mapped_column(Integer, default=0)
    over_quota_weight: Mapped[int] = mapped_column(Integer, default=1)
    limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    groups: Mapped[list] = mapped_column(JSON, default=list)
    updated: Mapped[float] = mapped_column(Float, default=0.0)
    # The priorities members may give their jobs (admins set the range): a job's priority
    # orders it within its project only.
    job_priority_min: Mapped[int] = mapped_column(Integer, default=-100, server_default="-100")
    job_priority_max: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The department the project belongs to (DepartmentRow.name), None for none.
    department: Mapped[str | None] = mapped_column(String(100), nullable=True, default=None)


class DepartmentRow(Base):
    """Projects over projects (``policy/departments.py``): ``quota`` milli-GPUs guaranteed to
    its projects together (they name it in ``ProjectRow.department``), ``limit`` on what they
    hold together (None: none), ``over_quota_weight`` for its share of idle GPUs."""

    __tablename__ = "departments"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    quota: Mapped[int] = mapped_column(Integer, default=0)
    over_quota_weight: Mapped[int] = mapped_column(Integer, default=1)
    limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated: Mapped[float] = mapped_column(Float, default=0.0)


class JobRow(Base):
    __tablename__ = "jobs"
    # A client-chosen key (Idempotency-Key or request_id): a retried submit finds its job.
    __table_args__ = (UniqueConstraint("user", "request_id", name="uq_jobs_user_request_id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    project: Mapped[str] = mapped_column(String(100), index=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    gpus: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    command: Mapped[list] = mapped_column(JSON)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    workdir: Mapped[str | None] = mapped_column(Text, nullable=True)
    per_gpu: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    checkpoint_dir: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    submitted: Mapped[float] = mapped_column(Float)
    pending_since: Mapped[float] = mapped_column(Float)
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[dict] = mapped_column(JSON, default=dict)
    handle: Mapped[dict] = mapped_column(JSON, default=dict)
    preempting: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")  # why it ended, in words
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


# Why the pool stopped an attempt (AttemptRow.stop): the policy's preemptions, a drain of
# its node, a cancel
DRAIN, CANCEL = "drain", "cancel"
STOPS = (*(k.value for k in PreemptKind), DRAIN, CANCEL)


class AttemptRow(Base):
    __tablename__ = "attempts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    started: Mapped[float] = mapped_column(Float)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[dict] = mapped_column(JSON, default=dict)
    outcome: Mapped[str] = mapped_column(String(16), default="")  # succeeded|failed|preempted|lost|cancelled
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Why the pool stopped it (STOPS; None: it was not stopped)
    stop: Mapped[str | None] = mapped_column(String(16), nullable=True)


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    t: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))  # submit|start|preempt|requeue|finish|cancel
    attempt: Mapped[int] = mapped_column(Integer)
    detail: Mapped[str] = mapped_column(Text, default="")


class SliceRow(Base):
    """A build slice reserved for a notebook server: ``milli`` of GPU ``gpu`` on ``node``."""

    __tablename__ = "slices"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    milli: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(255))
    gpu: Mapped[int] = mapped_column(Integer)
    created: Mapped[float] = mapped_column(Float)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the server's, once started


class UsageRow(Base):
    """GPU time of one row (a pool, GPU, project, job attempt or slice) in one time bucket of
    ``step`` seconds from ``t``: 60 s rows for recent days, 3600 s rows for older ones. Amounts
    are milli-GPU-seconds (``usage/rollup.py`` defines them); rows of the same bucket and key
    add up (a restart may write a bucket twice)."""

    __tablename__ = "usage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    t: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8))  # pool|gpu|project|job|slice
    key: Mapped[str] = mapped_column(String(255))
    node: Mapped[str] = mapped_column(String(255), default="")
    project: Mapped[str] = mapped_column(String(100), default="")
    user: Mapped[str] = mapped_column(String(255), default="")
    job: Mapped[str] = mapped_column(String(32), default="")
    capacity: Mapped[float] = mapped_column(Float, default=0.0)
    allocated: Mapped[float] = mapped_column(Float, default=0.0)
    measured: Mapped[float] = mapped_column(Float, default=0.0)
    utilized: Mapped[float] = mapped_column(Float, default=0.0)
    idle: Mapped[float] = mapped_column(Float, default=0.0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    memory_peak: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_total: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (Index("ix_usage_step_kind_t", "step", "kind", "t"),)


class AuditRow(Base):
    """One thing an admin (or the configuration, or culling, or a user's notebook server
    taking back a lent build GPU) changed: who, when, what, through which door (``via``: api,
    dashboard, cli, config, culling or lending), and the values before and after (None: there
    was none, or there is none now)."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    who: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255), default="")
    before: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    via: Mapped[str] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(String(64), default="")  # the client's, where known


class DrainRow(Base):
    """A drained train node: no new job starts there; what runs finishes (or was requeued)."""

    __tablename__ = "drained_nodes"

    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    by: Mapped[str] = mapped_column(String(255))
    since: Mapped[float] = mapped_column(Float)


class FairShareRow(Base):
    """Fair share over time (``policy/past_use.py``): milli-GPU-seconds ``project`` held beyond
    its quota in bucket ``bucket`` (of ``step`` seconds from time 0). Rows of another step
    (the window was changed) are not read; old buckets are forgotten."""

    __tablename__ = "fair_share_use"

    project: Mapped[str] = mapped_column(String(100), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    borrowed: Mapped[float] = mapped_column(Float)
