"""Conveyor's Redis-facing worker: jobs in from Redis Streams, token events out per request.

A job's path: read from a lane (reads.py, lanes.py, read_policy.py), looked up and admitted or refused
(job_path.py), run by the loop (loop.py) with one round of Redis commands per engine step (round.py,
redis_io.py), its events written (publish.py), taken over after a crash (reclaim.py, resume.py).
Every Redis name is in keys.py, the wire schema in protocol.py.
"""
