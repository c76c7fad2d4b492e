"""Conveyor's Redis-facing worker: jobs in from a Redis Stream, token events out per request.

Modules, one idea each: keys (every Redis name), protocol (the wire schema), intake (parsing entries),
admit (turning a job into an engine request), lease / reclaim / resume (takeover after a crash),
events (building event payloads), round (one pipelined round trip per step), loop (the main loop).
"""
