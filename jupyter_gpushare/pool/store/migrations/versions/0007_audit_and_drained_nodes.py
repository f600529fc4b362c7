"""the audit trail (who changed what, when, through which door) and drained train nodes

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('audit',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('who', sa.String(length=255), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=255), nullable=False),
    sa.Column('before', sa.JSON(), nullable=True),
    sa.Column('after', sa.JSON(), nullable=True),
    sa.Column('via', sa.String(length=16), nullable=False),
    sa.Column('address', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('audit', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_at'), ['at'], unique=False)

    op.create_table('drained_nodes',
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('by', sa.String(length=255), nullable=False),
    sa.Column('since', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('node')
    )


def downgrade():
    op.drop_table('drained_nodes')
    with op.batch_alter_table('audit', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_at'))
    op.drop_table('audit')
