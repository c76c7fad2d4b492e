"""`conveyor worker --priority-lanes LEVELS` and `--tenant-weight NAME=W`: the lane layout they ask for
(intake/lane_layout.py), or a usage error for a combination the worker does not run."""

from __future__ import annotations

import click

from worker.intake.lane_layout import LaneLayout, parse_levels, parse_weights, priority_layout, tenant_layout
from worker.keys import Keys

PRIORITY_HELP = (
    "priority lanes: comma-separated levels, e.g. 0,10; a job waits in the lane of the largest level not "
    "above its priority and smaller levels are read first across the backlog (docs/operations.md)"
)
TENANT_HELP = (
    "tenant lanes with weighted fair share in tokens served: NAME=W (repeatable; W default 1); a tenant "
    "not named gets a lane of weight 1 once a client adds its first job; jobs without a tenant share the "
    "default lane, weighed by default=W (docs/operations.md)"
)


def lane_layout(
    keys: Keys, priority_lanes: str | None, tenant_weights: tuple[str, ...], sharded: bool
) -> tuple[LaneLayout | None, dict[str, float]]:
    """The layout and the tenants' weights; (None, {}) when neither option is given (one stream, as
    always). `sharded`: --cluster or --shards was given."""
    if not priority_lanes and not tenant_weights:
        return None, {}
    if priority_lanes and tenant_weights:
        raise click.UsageError(
            "--priority-lanes and --tenant-weight cannot be combined: a worker reads priority lanes or "
            "tenant lanes (run a worker of each kind under different --stream names instead)"
        )
    if sharded:
        raise click.UsageError(
            "priority or tenant lanes cannot be combined with --cluster or --shards: the sharded layout "
            "already splits the requests stream, by shard"
        )
    try:
        if priority_lanes:
            return priority_layout(keys, parse_levels(priority_lanes)), {}
        weights = parse_weights(tenant_weights)
        return tenant_layout(keys, list(weights)), weights
    except ValueError as exc:
        hint = "--priority-lanes" if priority_lanes else "--tenant-weight"
        raise click.BadParameter(str(exc), param_hint=hint) from None
