"""usage rollups (usage/rollup.py) and the pid of a slice's notebook server

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('usage',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('t', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('project', sa.String(length=100), nullable=False),
    sa.Column('user', sa.String(length=255), nullable=False),
    sa.Column('job', sa.String(length=32), nullable=False),
    sa.Column('capacity', sa.Float(), nullable=False),
    sa.Column('allocated', sa.Float(), nullable=False),
    sa.Column('measured', sa.Float(), nullable=False),
    sa.Column('utilized', sa.Float(), nullable=False),
    sa.Column('idle', sa.Float(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('memory_peak', sa.BigInteger(), nullable=False),
    sa.Column('memory_total', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.create_index('ix_usage_step_kind_t', ['step', 'kind', 't'], unique=False)

    with op.batch_alter_table('slices', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pid', sa.Integer(), nullable=True))



def downgrade():
    with op.batch_alter_table('slices', schema=None) as batch_op:
        batch_op.drop_column('pid')

    with op.batch_alter_table('usage', schema=None) as batch_op:
        batch_op.drop_index('ix_usage_step_kind_t')

    op.drop_table('usage')
