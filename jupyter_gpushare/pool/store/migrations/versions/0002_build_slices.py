"""build slices

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('slices',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user', sa.String(length=255), nullable=False),
    sa.Column('server', sa.String(length=255), nullable=False),
    sa.Column('milli', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=False),
    sa.Column('created', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('slices', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_slices_user'), ['user'], unique=False)



def downgrade():
    with op.batch_alter_table('slices', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_slices_user'))

    op.drop_table('slices')
