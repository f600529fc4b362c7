"""request ids: a retried submit returns the job it made

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('request_id', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint('uq_jobs_user_request_id', ['user', 'request_id'])


def downgrade():
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('uq_jobs_user_request_id', type_='unique')
        batch_op.drop_column('request_id')
