"""Claiming one due row with a lease: how several processes share the job queue and the
webhook outbox without doing any item twice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from server.db.driver import fetch_rows
from server.db.models import TableModel

RowT = TypeVar("RowT", bound=TableModel)


def _ready(table: Any, statuses: tuple[str, ...]) -> sa.ColumnElement[bool]:
    # Plain parameters, no expanding IN: the driver compiles a statement once.
    return sa.or_(*(table.c.status == sa.literal(status) for status in statuses))


# How many of the earliest due rows of a status a capped claim looks through before it walks
# the workspaces instead (Claimer).
HEAD_ROWS = 64


@dataclass(frozen=True)
class _StatusQueue:
    """The rows of one ready `status` of a capped queue, as the claim's statement reads them
    (`index` names its aliases apart from another status's)."""

    table: Any
    status: str
    due_column: str
    now: sa.BindParameter[Any]
    free: Callable[[Any], sa.ColumnElement[bool]]
    at_cap: sa.Select[Any]
    index: int

    def _due(self, rows: Any) -> tuple[sa.ColumnElement[bool], ...]:
        """Rows (of an alias) of this status that are due and free."""
        return (
            rows.c.status == sa.literal(self.status),
            rows.c[self.due_column] <= self.now,
            self.free(rows),
        )

    def earliest_uncapped(self) -> sa.ScalarSelect[Any]:
        """The id of the earliest due, free row whose workspace is below its cap.

        First the head of the queue: the HEAD_ROWS earliest due rows (the index on status and
        due), whose first row of an uncapped workspace is the one (every row before it is a
        capped one's) — the usual case, however many workspaces have work waiting. Only when
        capped workspaces fill the whole head (a backlog behind a slow receiver) the walk
        through the workspaces (`_walk`), which COALESCE evaluates only then."""
        rows = self.table.alias(f"queue_{self.index}")
        head = (
            sa.select(rows.c.id, rows.c.workspace_id, rows.c[self.due_column].label("due"))
            .where(*self._due(rows))
            .order_by(rows.c[self.due_column])
            .limit(HEAD_ROWS)
            .subquery(f"head_{self.index}")
        )
        from_head = (
            sa.select(head.c.id)
            .where(head.c.workspace_id.not_in(self.at_cap))
            .order_by(head.c.due)
            .limit(1)
            .scalar_subquery()
        )
        walked = self.table.alias(f"walked_{self.index}")
        from_walk = (
            sa.select(walked.c.id)
            .where(walked.c.id.in_(self._walk()))
            .order_by(walked.c[self.due_column])
            .limit(1)
            .scalar_subquery()
        )
        return sa.select(sa.func.coalesce(from_head, from_walk)).scalar_subquery()

    def _walk(self) -> sa.Select[Any]:
        """The id of each uncapped workspace's earliest due, free row: a recursive walk from
        one workspace with rows of this status to the next (each step one seek of the index
        on status, workspace_id, due), then one seek per workspace for its earliest due row."""
        first = self.table.alias(f"first_{self.index}")
        step = self.table.alias(f"step_{self.index}")
        rows = self.table.alias(f"earliest_{self.index}")
        first_workspace = (
            sa.select(first.c.workspace_id.label("workspace_id"))
            .where(first.c.status == sa.literal(self.status))
            .order_by(first.c.workspace_id)
            .limit(1)
            .subquery()
        )
        workspaces = sa.select(first_workspace.c.workspace_id).cte(
            f"workspaces_{self.index}", recursive=True
        )
        following = (
            sa.select(step.c.workspace_id)
            .where(
                step.c.status == sa.literal(self.status),
                step.c.workspace_id > workspaces.c.workspace_id,
            )
            .order_by(step.c.workspace_id)
            .limit(1)
            .scalar_subquery()
        )
        workspaces = workspaces.union_all(
            sa.select(following).where(workspaces.c.workspace_id.is_not(None))
        )
        earliest = (
            sa.select(rows.c.id)
            .where(rows.c.workspace_id == workspaces.c.workspace_id, *self._due(rows))
            .order_by(rows.c[self.due_column])
            .limit(1)
            .scalar_subquery()
        )
        return sa.select(earliest).where(
            workspaces.c.workspace_id.is_not(None), workspaces.c.workspace_id.not_in(self.at_cap)
        )


class Claimer:
    """Claims the oldest due, unleased, ready row of one queue with a lease: on PostgreSQL
    rows being claimed elsewhere are skipped (`FOR UPDATE SKIP LOCKED`); everywhere the
    conditional UPDATE decides who owns it. Its statements are built once and run through the
    driver (server/db/driver.py: compiled once per dialect, one hand-off to aiosqlite's thread
    per statement, no per-call compile or cache-key work). `extra_columns` are set with the
    lease, from `extra_values` of each claim."""

    def __init__(
        self,
        model: type[RowT],
        *,
        ready_statuses: tuple[str, ...],
        due_column: str,
        extra_columns: tuple[str, ...] = (),
        per_workspace: int | None = None,
        lock_key: int | None = None,
    ) -> None:
        """`ready_statuses`: the `status` values of a claimable row. `per_workspace`: a row
        is claimed only while its workspace has fewer rows ready and leased right now, across
        every process (counted in the database), so one workspace's slow work fills its own
        share and leaves the rest to the others; PostgreSQL's claims then take the advisory
        transaction lock `lock_key` in turn, so that two racing claims cannot both see a
        workspace below its cap (SQLite has one writer).

        With a cap the claim never walks more than HEAD_ROWS rows of a status that belong to
        workspaces at their cap (a backlog of thousands behind a slow receiver would make
        every claim, every other workspace's included, as slow as the backlog is long): it
        looks at the earliest HEAD_ROWS due rows of each ready status, and only when every
        one is a capped workspace's does it step through the workspaces that have ready rows
        of that status, one index seek each (status, workspace_id, due: a loose index scan),
        and take the earliest due free row of the uncapped ones (`_StatusQueue`). The
        capped workspaces are found from the leases in force (an index on
        lease_expires_at)."""
        if per_workspace is not None and lock_key is None:
            raise ValueError("a per-workspace cap needs a lock key for PostgreSQL's claims")
        table = model.__table__
        self._model = model
        self._extra = extra_columns
        now = sa.bindparam("now", type_=table.c[due_column].type)

        def free(rows: Any) -> sa.ColumnElement[bool]:
            return sa.or_(rows.c.lease_expires_at.is_(None), rows.c.lease_expires_at < now)

        claimable = _ready(table, ready_statuses)
        self._lock = (
            None
            if lock_key is None
            else sa.select(sa.func.pg_advisory_xact_lock(sa.literal(lock_key, sa.BigInteger)))
        )
        if per_workspace is None:
            due = (
                sa.select(table.c.id)
                .where(claimable, table.c[due_column] <= now, free(table))
                .order_by(table.c[due_column])
                .limit(1)
            )
        else:
            # The leases in force, found by their index and set apart first (materialized:
            # left to itself, a planner without statistics would rather walk every ready row
            # by its status).
            busy = table.alias("busy")
            leased = (
                sa.select(busy.c.workspace_id, busy.c.status)
                .where(busy.c.lease_expires_at >= now)
                .cte("leased")
                .prefix_with("MATERIALIZED")
            )
            at_cap = (
                sa.select(leased.c.workspace_id)
                .where(_ready(leased, ready_statuses))
                .group_by(leased.c.workspace_id)
                .having(sa.func.count() >= sa.literal(per_workspace))
            )
            claimable = sa.and_(claimable, table.c.workspace_id.not_in(at_cap))
            # Each ready status's earliest row of an uncapped workspace; the earliest of them.
            candidates = [
                sa.select(
                    _StatusQueue(
                        table, status, due_column, now, free, at_cap, index
                    ).earliest_uncapped()
                )
                for index, status in enumerate(ready_statuses)
            ]
            due = (
                sa.select(table.c.id)
                .where(
                    table.c.id.in_(
                        sa.union_all(*candidates) if len(candidates) > 1 else candidates[0]
                    )
                )
                .order_by(table.c[due_column])
                .limit(1)
            )
        lease_values = {
            "lease_owner": sa.bindparam("owner", type_=table.c.lease_owner.type),
            "lease_expires_at": sa.bindparam("expires", type_=table.c.lease_expires_at.type),
            **{
                name: sa.bindparam(f"new_{name}", type_=table.c[name].type)
                for name in extra_columns
            },
        }
        # Find and lease in one statement (one round trip, or one hand-off to SQLite): the
        # row chosen by the subquery is leased only if it is still ready and free when the
        # UPDATE reaches it (another process may have claimed it meanwhile: then no row).
        self._claim: dict[str, sa.Executable] = {
            dialect: sa.update(table)
            .where(table.c.id == chosen.scalar_subquery(), claimable, free(table))
            .values(lease_values)
            .returning(*table.c)
            for dialect, chosen in (
                ("sqlite", due),
                ("postgresql", due.with_for_update(skip_locked=True, of=table)),
            )
        }
        self._columns = tuple(c.name for c in table.c)
        self._processors: dict[str, list[Any]] = {}

    def _instance(self, row: Any, dialect: sa.Dialect) -> Any:
        """The model instance of one claimed row; a raw driver row's values converted by the
        columns' types, as SQLAlchemy converts its own results (a SQLAlchemy row already is)."""
        if isinstance(row, sa.Row):
            return self._model(**row._asdict())
        processors = self._processors.get(dialect.name)
        if processors is None:
            table = self._model.__table__
            processors = [
                table.c[name].type.dialect_impl(dialect).result_processor(dialect, None)
                for name in self._columns
            ]
            self._processors[dialect.name] = processors
        return self._model(
            **{
                name: value if processor is None else processor(value)
                for name, processor, value in zip(self._columns, processors, row, strict=True)
            }
        )

    async def claim(
        self,
        session: AsyncSession,
        *,
        owner: str,
        now: datetime,
        lease: timedelta,
        extra_values: dict[str, Any] | None = None,
    ) -> Any:
        """The oldest due, unleased, ready row leased to `owner` (an instance of the model),
        or None when there is none or another process won it. Commits."""
        values = extra_values or {}
        if self._lock is not None and session.get_bind().dialect.name == "postgresql":
            await fetch_rows(session, self._lock, {})  # held until the claim commits
        claimed = await fetch_rows(
            session,
            self._claim,
            {
                "now": now,
                "owner": owner,
                "expires": now + lease,
                **{f"new_{name}": values[name] for name in self._extra},
            },
        )
        # The bind's dialect: no connection asked of the session.
        leased = (
            None if len(claimed) != 1 else self._instance(claimed[0], session.get_bind().dialect)
        )
        await session.commit()
        return leased

    async def renew(
        self, session: AsyncSession, *, row_id: str, owner: str, now: datetime, lease: timedelta
    ) -> bool:
        """Extend `owner`'s lease of the row to `now + lease`; False when the row is no
        longer leased to `owner` (its lease was cleared or taken over). Commits."""
        table = self._model.__table__
        result = await session.exec(
            sa.update(table)
            .where(table.c.id == row_id, table.c.lease_owner == owner)
            .values(lease_expires_at=now + lease)
        )
        await session.commit()
        return bool(result.rowcount == 1)
