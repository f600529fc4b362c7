"""The pool service's records: the database (SQLAlchemy, alembic migrations) and what is read from
it."""
