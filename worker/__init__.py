"""Conveyor's Redis-facing worker: jobs in from Redis Streams, token events out per request.

The folders follow a job's path: intake/ (lanes, the read policy, reading and parsing entries), then
job_path.py (every stage, from read to acknowledged), run/ (the loop, one round of Redis commands per
engine step, leases, aborts), publish/ (the events script), recover/ (takeover after a crash, resume
points, Redis health); cli/ is the `conveyor` command, batch/ its OpenAI batch runner, cluster/ Redis
Cluster mode. Shared by all: keys.py (every Redis name), protocol.py (the wire schema), config.py,
error_codes.py, connection.py, client.py and job_queue.py (for clients), local_redis.py.
"""
