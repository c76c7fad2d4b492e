"""`pip install .` on a CPU machine brings neither triton nor xgrammar (pyproject's `gpu` and `structured`
extras). The engine and the worker must import and serve the tiny model without them, refuse a constrained
job with the extra to install, and name the extra when the triton backend is asked for.

The child marks both packages absent (`sys.modules[name] = None`: `import` raises ModuleNotFoundError and
`importlib.util.find_spec` answers None, as for a package that is not installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ABSENT = """
import sys
for name in ("triton", "xgrammar"):
    sys.modules[name] = None
"""

ENGINE = """
import torch
from engine import LLMEngine, RequestRejected, SamplingParams
from engine.attention.backend import get_attention_backend

llm = LLMEngine(MODEL, num_kv_blocks=64, max_num_seqs=4)
out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0))[0]
try:
    llm.add_request("c", "Hello", SamplingParams(max_tokens=4, response_format={"type": "json_object"}))
    refused = None
except RequestRejected as exc:
    refused = [exc.reason.value, str(exc)]
try:
    get_attention_backend("triton", torch.device("cpu"))
    triton_error = None
except RuntimeError as exc:
    triton_error = str(exc)
"""

WORKER = """
import redis
import worker.cli.main, worker.gateway.app, worker.fleet.top_view  # noqa: F401  (the commands' modules)
from tests.helpers.worker_fakes import real_engine, running_worker
from worker.client import events
from worker.job_queue import SingleQueue
from worker.keys import Keys

queue = SingleQueue(redis.Redis.from_url(URL), Keys())
queue.submit({"id": "plain", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
queue.submit({"id": "json", "prompt": "Hello", "max_tokens": 4, "response_format": {"type": "json_object"}})
ends = {}
with running_worker(real_engine(MODEL), URL):
    for job_id in ("plain", "json"):
        ends[job_id] = [e for e in events(queue.client, job_id, timeout_s=60)][-1]
"""

REPORT = """
print(json.dumps({"report": {k: v for k, v in globals().items() if k in KEYS},
                  "triton": sys.modules.get("triton") is None, "xgrammar": sys.modules.get("xgrammar") is None}))
"""

NOT_INSTALLED = "pip install 'conveyor[structured]'"


def _run(body: str, keys: tuple[str, ...], **values: str) -> dict:
    consts = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    code = ABSENT + "import json\n" + consts + f"KEYS = {keys!r}\n" + body + REPORT
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["triton"] and result["xgrammar"], "the child imported triton or xgrammar after all"
    return result["report"]


@pytest.mark.timeout(300)
def test_the_engine_runs_without_triton_and_xgrammar(tiny_model_dir):
    body = ENGINE + "tokens = len(out.token_ids)\n"
    got = _run(body, ("tokens", "refused", "triton_error"), MODEL=str(tiny_model_dir("llama")))
    assert got["tokens"] == 4
    assert got["refused"][0] == "invalid_constraint" and NOT_INSTALLED in got["refused"][1]
    assert "pip install 'conveyor[gpu]'" in got["triton_error"]


@pytest.mark.redis
@pytest.mark.timeout(300)
def test_the_worker_serves_without_triton_and_xgrammar(tiny_model_dir, redis_server):
    got = _run(WORKER, ("ends",), MODEL=str(tiny_model_dir("llama")), URL=redis_server.url)
    plain, constrained = got["ends"]["plain"], got["ends"]["json"]
    assert plain["type"] == "done" and plain["usage"]["completion_tokens"] == 4, plain
    assert constrained["type"] == "error" and constrained["code"] == "invalid_params", constrained
    assert NOT_INSTALLED in constrained["message"], constrained
