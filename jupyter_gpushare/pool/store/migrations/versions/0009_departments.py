"""departments: a second level of quotas over projects

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('departments',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('quota', sa.Integer(), nullable=False),
    sa.Column('over_quota_weight', sa.Integer(), nullable=False),
    sa.Column('limit', sa.Integer(), nullable=True),
    sa.Column('updated', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    with op.batch_alter_table('projects') as batch:
        batch.add_column(sa.Column('department', sa.String(length=100), nullable=True))


def downgrade():
    with op.batch_alter_table('projects') as batch:
        batch.drop_column('department')
    op.drop_table('departments')
