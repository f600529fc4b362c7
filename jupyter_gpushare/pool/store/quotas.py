"""The quota tree admins set, in the pool's database: projects (``ProjectRow``) and the
departments over them (``DepartmentRow``; a project names its own in ``department``).

One part for both: a department's members are project rows, so changing them is one
transaction over both tables. Every method blocks on the database.
"""

from __future__ import annotations

from typing import Iterable

from sqlalchemy import select

from .models import DepartmentRow, ProjectRow


class QuotaStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions this part reads and writes with."""
        self.session, self.writing = store.session, store.writing

    # -- projects -------------------------------------------------------------------------
    def projects(self) -> list[ProjectRow]:
        with self.session() as s:
            return list(s.scalars(select(ProjectRow).order_by(ProjectRow.name)))

    def project(self, name: str) -> ProjectRow | None:
        with self.session() as s:
            return s.get(ProjectRow, name)

    def add_missing_projects(self, projects: Iterable[ProjectRow]) -> list[str]:
        """Create the configured projects that the store does not have yet; the ones it has
        keep what admins set through the API. Returns the names created."""
        created = []
        with self.writing() as s:
            for p in projects:
                if s.get(ProjectRow, p.name) is None:
                    s.add(p)
                    created.append(p.name)
        return created

    def update_project(self, name: str, fields: dict, now: float) -> ProjectRow:
        with self.writing() as s:
            row = s.get(ProjectRow, name)
            for key, value in fields.items():
                setattr(row, key, value)
            row.updated = now
        return row

    # -- departments ----------------------------------------------------------------------
    def departments(self) -> list[DepartmentRow]:
        with self.session() as s:
            return list(s.scalars(select(DepartmentRow).order_by(DepartmentRow.name)))

    def department(self, name: str) -> DepartmentRow | None:
        with self.session() as s:
            return s.get(DepartmentRow, name)

    def members(self, department: str) -> list[str]:
        """The projects of ``department``, by name."""
        with self.session() as s:
            return list(s.scalars(select(ProjectRow.name).where(
                ProjectRow.department == department).order_by(ProjectRow.name)))

    def put_department(self, name: str, fields: dict, members: list[str] | None,
                       now: float) -> DepartmentRow:
        """Create or change department ``name``; ``members`` (when given) become its only
        projects, in one transaction, so that no cycle sees half of the change."""
        with self.writing() as s:
            row = s.get(DepartmentRow, name)
            if row is None:
                row = DepartmentRow(name=name, quota=0, over_quota_weight=1, limit=None)
                s.add(row)
            for key, value in fields.items():
                setattr(row, key, value)
            row.updated = now
            if members is not None:
                for project in s.scalars(select(ProjectRow).where(
                        (ProjectRow.department == name) | ProjectRow.name.in_(members))):
                    project.department = name if project.name in members else None
        return row

    def delete_department(self, name: str) -> bool:
        """Remove a department; its projects belong to none from then on (one transaction)."""
        with self.writing() as s:
            row = s.get(DepartmentRow, name)
            if row is None:
                return False
            for project in s.scalars(select(ProjectRow).where(ProjectRow.department == name)):
                project.department = None
            s.delete(row)
        return True
