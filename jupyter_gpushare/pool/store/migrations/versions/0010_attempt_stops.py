"""attempts.stop: why the pool stopped an attempt (guarantee, fair, priority, move, take back,
drain, cancel), so that a stop's kind is recorded, not guessed from its wording

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('stop', sa.String(length=16), nullable=True))


def downgrade():
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('stop')
