"""async_scheduling gives the tokens synchronous scheduling gives, through every path a step can take.

One workload runs twice on the same tiny model, once per mode: mixed prefill/decode batches under a small
token budget (chunked prefill), a KV pool small enough to preempt, shared prompt prefixes (prefix cache),
n > 1 forks, stop strings, stop tokens, max_tokens, min_tokens, logprobs, seeded sampling with penalties,
an abort, and a grammar. Every sample's tokens, finish reason, text and logprobs must match."""

from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams
from engine.outputs import StepDelta

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(
    max_tokens=20, temperature=0.9, top_p=0.9, top_k=40, repetition_penalty=1.2, seed=11, ignore_eos=True
)


def _engine(model_dir, async_scheduling: bool, **kw) -> LLMEngine:
    options = dict(num_kv_blocks=12, block_size=16, max_num_batched_tokens=48, max_num_seqs=8)
    options.update(kw)
    return LLMEngine(
        str(model_dir), dtype="float32", device="cpu", async_scheduling=async_scheduling, **options
    )


def _run(llm: LLMEngine, waves: list[list[tuple]], abort: tuple[int, str] | None = None) -> dict:
    """Add each wave two steps after the last, abort `abort[1]` at step `abort[0]`; keep every delta."""
    seen: dict[tuple[str, int], list[StepDelta]] = {}
    step = 0
    while waves or llm.has_unfinished_requests():
        if waves and step % 2 == 0:
            for rid, prompt, params in waves.pop(0):
                llm.add_request(rid, prompt, params)
        if abort is not None and step == abort[0]:
            llm.abort(abort[1])
        for d in llm.step():
            seen.setdefault((d.request_id, d.sample_index), []).append(d)
        step += 1
    return seen


def _summary(seen: dict) -> dict:
    out = {}
    for key, deltas in seen.items():
        tokens = [t for d in deltas for t in d.new_token_ids]
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
        assert [d.finished for d in deltas].count(True) == 1 and deltas[-1].finished
        out[key] = (tokens, deltas[-1].finish_reason, deltas[-1].text, logprobs)
    return out


def _exact(summary: dict) -> dict:
    """Per sample: tokens, finish reason, text."""
    return {key: value[:3] for key, value in summary.items()}


def _workload(vocab: int) -> list[list[tuple]]:
    prefix = [(7 * i) % (vocab - 3) + 3 for i in range(40)]
    return [
        [
            ("g-long", list(range(3, 70)), GREEDY),  # two chunks of the 48-token budget
            ("g-short", [5, 9, 13], GREEDY.model_copy(update={"max_tokens": 5})),
            ("seeded", list(range(20, 35)), SAMPLED),
            ("fork", list(range(40, 59)), SAMPLED.model_copy(update={"n": 3, "seed": 5})),
        ],
        [
            ("prefix-a", prefix + [1, 2], GREEDY.model_copy(update={"logprobs": 2})),
            ("stop-str", list(range(60, 80)), GREEDY.model_copy(update={"stop": ["e", "a"]})),
            ("min", [8, 8, 8], SAMPLED.model_copy(update={"min_tokens": 6, "max_tokens": 9, "seed": 3})),
        ],
        [
            ("prefix-b", prefix + [3, 4, 5], GREEDY),  # its first 32 tokens from the prefix cache
            ("presence", [30, 31, 32], SAMPLED.model_copy(update={"presence_penalty": 0.5, "seed": 8})),
        ],
    ]


def test_async_scheduling_gives_the_same_tokens(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    results, stats = [], []
    for mode in (False, True):
        with _engine(model_dir, mode) as llm:
            waves = _workload(llm.spec.vocab_size)
            # A stop token that greedy decoding of "g-long" meets early, found by the synchronous run.
            if mode is False:
                probe = llm.generate([list(range(3, 70))], GREEDY)[0].token_ids
                stop_token = probe[3]
            waves[1].append(
                ("stop-tok", list(range(3, 70)), GREEDY.model_copy(update={"stop_token_ids": [stop_token]}))
            )
            results.append(_summary(_run(llm, waves, abort=(6, "g-long"))))
            stats.append(llm.stats())
            assert llm.stats().num_kv_blocks_used == 0
    sync, overlapped = results
    aborted_sync, aborted_async = sync.pop(("g-long", 0)), overlapped.pop(("g-long", 0))
    assert _exact(sync) == _exact(overlapped)
    for key, (*_, logprobs) in sync.items():  # a step's batch differs: logprobs agree to float rounding
        other = overlapped[key][3]
        assert [[t for t, _ in lp] for lp in logprobs] == [[t for t, _ in lp] for lp in other], key
        flat = [v for lp in logprobs for _, v in lp]
        assert flat == pytest.approx([v for lp in other for _, v in lp], abs=1e-5), key
    assert aborted_sync[1] == aborted_async[1] == "abort"
    assert aborted_async[0] == aborted_sync[0][: len(aborted_async[0])]  # fewer back in time, same ones
    assert sync[("prefix-a", 0)][3], "logprobs asked for"
    assert all(s.num_preemptions > 0 for s in stats), "the pool should be small enough to preempt"
    assert all(s.prefix_cache_hits >= 32 for s in stats)
    assert sync[("stop-tok", 0)][1] == "stop" and sync[("stop-tok", 0)][0][-1] == stop_token
    assert {sync[("fork", k)][1] for k in range(3)} == {"length"}


def test_a_finished_request_never_publishes_the_token_computed_after_it(tiny_model_dir):
    """A stop token sampled at step k ends the request; step k+1 (already submitted) computed one more
    token for it, which must not come out."""
    model_dir = tiny_model_dir("llama")
    prompt = list(range(3, 30))
    with _engine(model_dir, False) as llm:
        full = llm.generate([prompt], GREEDY)[0].token_ids
    stop = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=[full[4]])
    with _engine(model_dir, True) as llm:
        scheduled: list[list[str]] = []
        submit = llm.runner.submit

        def recording(sched_out, forward=None):
            scheduled.append([s.request_id for s in sched_out.sequences])
            return submit(sched_out, forward)

        llm.runner.submit = recording
        llm.add_request("r", prompt, stop)
        seen = _summary(_run(llm, []))
    tokens, reason, _, _ = seen[("r", 0)]
    assert reason == "stop" and tokens == full[: full.index(full[4]) + 1]
    # The prefill, one step per published token after the first, and one more the host scheduled before
    # it knew that the last token stopped the request.
    assert sum("r" in ids for ids in scheduled) == len(tokens) + 1


@pytest.mark.parametrize("mode", [False, True])
def test_grammar_constrained_output_is_the_same(tiny_model_dir, mode):
    params = SamplingParams(max_tokens=12, temperature=0, structured_outputs={"regex": "[a-f]{3}z"})
    model_dir = tiny_model_dir("llama")
    with _engine(model_dir, False) as llm:
        expected = llm.generate(["hello", "abc"], [params, GREEDY])
    with _engine(model_dir, mode) as llm:
        got = llm.generate(["hello", "abc"], [params, GREEDY])
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.text for o in got] == [o.text for o in expected]
