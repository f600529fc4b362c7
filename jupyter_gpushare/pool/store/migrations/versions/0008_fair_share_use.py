"""fair share over time: each project's borrowed GPU-time per time bucket

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('fair_share_use',
    sa.Column('project', sa.String(length=100), nullable=False),
    sa.Column('bucket', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('borrowed', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('project', 'bucket', 'step')
    )


def downgrade():
    op.drop_table('fair_share_use')
