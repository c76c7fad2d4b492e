"""Running jobs: the loop, its Redis rounds, job records, leases, aborts, stopping, metrics."""
