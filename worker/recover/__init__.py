"""Taking over after a crash or an outage: claiming lapsed leases, resume points, Redis health."""
