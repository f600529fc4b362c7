"""Alembic environment of the pool service's store (run through ``store.upgrade``)."""

from alembic import context
from sqlalchemy import engine_from_config, pool

from jupyter_gpushare.pool.store.models import Base

config = context.config
connection = config.attributes.get("connection")


def run(conn):
    context.configure(connection=conn, target_metadata=Base.metadata,
                      render_as_batch=conn.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    run(connection)
else:
    engine = engine_from_config(config.get_section(config.config_ini_section) or {},
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        run(conn)
