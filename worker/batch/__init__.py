"""`conveyor batch`: OpenAI Batch files (JSONL) in and out, every line a job through Redis.

input_line.py (a line -> a job; its body mapped by worker/openai/) -> runner.py (bounded in flight,
resumable) -> output_line.py (events -> an output line) ; progress.py (the terminal bar).
"""
