"""The HTTP side of benchmarks/llamacpp.py: wait for llama-server to be ready, send it token-id prompts on its
native `/completion` endpoint (greedy, `n_predict` tokens, EOS ignored where the job says so), several at a
time, and count the output tokens it reports."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from benchmarks.workload import Job


@dataclass(frozen=True)
class Completion:
    output_tokens: int  # the server's `tokens_predicted`
    text: str
    stop_type: str  # "limit" when n_predict was reached, "eos", "word", ...


def wait_ready(url: str, timeout_s: float = 300.0, alive=lambda: True) -> None:
    """Poll `GET /health` until it answers 200 (503 while the model loads). `alive()` false (the server
    process exited) or the timeout ends the wait with an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if not alive():
            raise RuntimeError(f"llama-server at {url} exited before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"llama-server at {url} not ready after {timeout_s:.0f} s")
        time.sleep(0.25)


def completion_body(job: Job) -> dict:
    """llama-server's `/completion` request for one job: the prompt as token ids, used as given (the chat
    template is already rendered into them), greedy."""
    return {
        "prompt": list(job.prompt_token_ids),
        "n_predict": job.max_tokens,
        "ignore_eos": job.ignore_eos,
        "temperature": 0.0,
        "stream": False,
        "cache_prompt": True,
    }


def complete(url: str, job: Job, timeout_s: float = 600.0) -> Completion:
    request = urllib.request.Request(
        f"{url}/completion",
        data=json.dumps(completion_body(job)).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"llama-server /completion answered {e.code}: {e.read()[:300]!r}") from e
    except (urllib.error.URLError, ConnectionError) as e:  # e.g. the server died mid-run
        raise RuntimeError(f"llama-server /completion failed: {e}") from e
    if "tokens_predicted" not in body:
        raise RuntimeError(f"llama-server /completion answer has no tokens_predicted: {str(body)[:300]}")
    return Completion(int(body["tokens_predicted"]), body.get("content", ""), body.get("stop_type", ""))


def run_requests(url: str, jobs: list[Job], concurrency: int) -> dict:
    """All jobs, at most `concurrency` in flight (one client thread each), timed from the first send to the
    last answer. Completions come back in the jobs' order."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(lambda job: complete(url, job), jobs))
    elapsed = time.perf_counter() - start
    tokens = sum(c.output_tokens for c in done)
    short = sum(
        1 for c, j in zip(done, jobs, strict=True) if j.ignore_eos and c.output_tokens != j.max_tokens
    )
    return {
        "output_tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "requests_not_at_n_predict": short,  # with ignore_eos every answer must be exactly n_predict long
        "first_text": done[0].text[:300] if done else "",
    }
