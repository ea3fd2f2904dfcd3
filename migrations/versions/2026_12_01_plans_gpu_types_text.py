"""plans.gpu_types as TEXT: a fleet of many GPU kinds with long custom profile names overflowed VARCHAR(1000)

The column holds ",name,name," for every GPU kind in the plan's fleet; custom profile names run to 64 characters and a
fleet has up to 1024 host groups, so no VARCHAR length is safe. PostgreSQL refused the insert (a 500 after the solve);
SQLite never enforced the length.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 13:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.alter_column(
            "gpu_types", existing_type=sa.String(length=1000), type_=sa.Text(), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.alter_column(
            "gpu_types", existing_type=sa.Text(), type_=sa.String(length=1000), existing_nullable=False
        )
