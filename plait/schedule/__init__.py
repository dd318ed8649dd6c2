"""From graph to kernels: choose which nodes get their own buffer, group the rest into fused kernels, and build a
Plan whose launches have their arguments bound in advance, so replaying it does no graph work at all."""

from plait.schedule.plan import Plan, realize
from plait.schedule.scheduler import Item, schedule

__all__ = ["Item", "Plan", "realize", "schedule"]
