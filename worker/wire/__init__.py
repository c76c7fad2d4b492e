"""The wire: what every part of the worker that talks to Redis builds on, importing none of them.

round.py records the commands of one round and the handlers of their replies; exchange.py writes rounds
to a node as MULTI ... EXEC and reads the replies back (below redis-py's public API, on a pooled
connection); lua_script.py runs a script by its SHA with a fallback to EVAL inside a round; job_record.py
is what the worker holds for a job between rounds; slot_following.py is a cluster shard's pool that
follows its slot's master; async_packing.py packs the gateway's asyncio commands with hiredis.
Used by intake/, publish/, recover/, run/, the gateway and cluster/.
"""
