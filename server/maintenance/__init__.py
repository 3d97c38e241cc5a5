"""Housekeeping of the shared tables, in one place (see maintenance.py)."""

from server.maintenance.maintenance import Maintenance

__all__ = ["Maintenance"]
