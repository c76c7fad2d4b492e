"""`conveyor batch`: OpenAI Batch files (JSONL) in and out, every line a job through Redis.

openai_input.py (a line -> a job) -> runner.py (bounded in flight, resumable) -> openai_output.py (events ->
an output line) ; progress.py (the terminal bar).
"""
