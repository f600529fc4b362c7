"""The pool service's records: the database (``database.Store``: SQLAlchemy, alembic migrations)
and a module for each kind of record in it: quotas, jobs (with the job book), slices, audit,
drains, past_use, usage_rollups and recorded_jobs."""
