"""benchmarks/llamacpp.py and its HTTP client, against a fake llama-server (tests/benchmarks/fake_llama_server.py)
speaking its `/completion` protocol."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import llamacpp
from benchmarks.llamacpp_client import complete, run_requests, wait_ready
from benchmarks.workload import Job
from tests.helpers.gguf_writer import write_gguf

FAKE = Path(__file__).with_name("fake_llama_server.py")


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """(url, path of the log of request bodies) of a running fake llama-server."""
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    port = llamacpp.free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, timeout_s=60, alive=lambda: proc.poll() is None)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_requests_carry_token_ids_n_predict_ignore_eos_greedy(fake_server):
    url, log = fake_server
    jobs = [Job([1, 2, 3], 5), Job([4, 5], 7, ignore_eos=False), Job([6], 2)]
    result = run_requests(url, jobs, concurrency=2)
    bodies = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda b: b["prompt"])
    assert [(b["prompt"], b["n_predict"], b["ignore_eos"]) for b in bodies] == [
        ([1, 2, 3], 5, True),
        ([4, 5], 7, False),
        ([6], 2, True),
    ]
    assert all(b["temperature"] == 0.0 and b["stream"] is False for b in bodies)
    assert result["output_tokens"] == 14
    assert result["requests_not_at_n_predict"] == 0
    assert result["tokens_per_s"] > 0
    assert result["first_text"] == " x" * 5  # the answer to the first job, whatever order they finished in


def test_an_error_answer_is_one_clear_error(fake_server):
    url, _ = fake_server
    with pytest.raises(RuntimeError, match="answered 404"):
        complete(url + "/nothing-here", Job([1], 1))


def test_no_server_is_one_clear_error():
    with pytest.raises(RuntimeError, match="/completion failed"):
        complete(f"http://127.0.0.1:{llamacpp.free_port()}", Job([1], 1))


def test_a_server_that_exits_is_reported_not_waited_for():
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        wait_ready(f"http://127.0.0.1:{llamacpp.free_port()}", timeout_s=60, alive=lambda: False)


def test_refuses_with_one_line_when_llama_server_is_not_built(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "resolve", lambda model: pytest.fail("fetched a model before the check"))
    with pytest.raises(llamacpp.NotBuilt) as refused:
        llamacpp.main(["--quick", "--llama-server", str(tmp_path / "llama-server")])
    message = str(refused.value)
    assert "llama-server is not built" in message and "benchmarks/build_llamacpp.sh" in message
    assert "\n" not in message


def test_configs_and_their_default_dtypes():
    assert llamacpp.parse_configs(None, None, None) == [(None, "float32")]
    assert llamacpp.parse_configs(None, "int4", None) == [("int4", "bfloat16")]
    assert llamacpp.parse_configs(None, "int8", "float32") == [("int8", "float32")]
    assert llamacpp.parse_configs("int4:bfloat16, auto:float32", "int8", None) == [
        ("int4", "bfloat16"),
        (None, "float32"),
    ]
    for bad in ("int4", "int4:float16", ":float32"):
        with pytest.raises(ValueError, match="quantization:dtype"):
            llamacpp.parse_configs(bad, None, None)


def test_quick_mode_runs_both_sides_on_a_gguf_file(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(tmp_path / "requests.jsonl"))
    gguf = write_gguf(tiny_model_dir("llama"), tmp_path / "tiny.gguf")
    out = llamacpp.main(
        [
            "--quick",
            "--model",
            str(gguf),
            "--llama-server",
            str(FAKE),
            "--threads",
            "1",
            "--configs",
            "auto:float32,int4:bfloat16",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    report = json.loads(out.read_text())
    # --quick: 8 requests of 16 tokens, 4 at a time, then 2 one at a time; every answer exactly 16 tokens.
    for side in ("conveyor", "llama_cpp"):
        assert report[side]["concurrent"]["output_tokens"] == 8 * 16
        assert report[side]["sequential"]["output_tokens"] == 2 * 16
    assert report["llama_cpp"]["concurrent"]["requests_not_at_n_predict"] == 0
    cmd = report["llama_cpp"]["command"]
    assert cmd[cmd.index("--parallel") + 1] == "4" and cmd[cmd.index("--threads") + 1] == "1"
    assert int(cmd[cmd.index("--ctx-size") + 1]) % (4 * 256) == 0
    served = report["conveyor"]["served"]
    assert served["model_file"] == "tiny.gguf" and served["quantization"] == "auto"
    assert served["weight_bytes_by_dtype"]["float32"] > 0
    assert set(report["ratio_conveyor_over_llama_cpp"]) == {"concurrent", "sequential"}
    # Every configuration ran the same workload against the one llama-server run.
    configs = report["conveyor_configs"]
    assert list(configs) == ["auto:float32", "int4:bfloat16"]
    assert configs["int4:bfloat16"]["served"]["quantization"] == "int4"
    assert configs["int4:bfloat16"]["served"]["dtype"] == "bfloat16"
    assert configs["int4:bfloat16"]["sequential"]["output_tokens"] == 2 * 16
    assert set(configs["int4:bfloat16"]["targets"]) == {"concurrent>=1.5", "sequential>=1.0"}
    assert len(report["load_average_before"]) == 3
    # Both sides got the same prompts: the fake server saw the rendered chat prompts of the workload.
    sent = [json.loads(line)["prompt"] for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(sent) == 4 + 8 + 2  # warm-up, concurrent, sequential
