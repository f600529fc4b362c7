"""job priority range per project

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.add_column(sa.Column('job_priority_min', sa.Integer(), nullable=False,
                                      server_default='-100'))
        batch_op.add_column(sa.Column('job_priority_max', sa.Integer(), nullable=False,
                                      server_default='0'))


def downgrade():
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.drop_column('job_priority_max')
        batch_op.drop_column('job_priority_min')
