"""Structured outputs: xgrammar against llguidance on this machine, then xgrammar's cost inside the engine.

    python benchmarks/structured_outputs.py          # both parts (minutes on 2 busy CPU cores)
    python benchmarks/structured_outputs.py 2        # one part; the other's last figures are kept
    python benchmarks/structured_outputs.py --quick --out /tmp/s.json   # tiny tokenizer and model: checks it runs

Part 1 (grammar engines, side by side, per tokenizer: the tiny model's 512-token BPE and a 32000-token
byte-level BPE trained here on the Python standard library):
  - compile: a typical extraction schema, cold (each run a schema the caches have not seen), median;
  - fill: one matcher's next-token mask, per generated token, mean over a valid instance of the schema;
  - batch 64: fill 64 rows and apply the mask to fp32 logits [64, 32000], per step, median.
Part 2 (the chosen engine, xgrammar, in LLMEngine on benchmarks/workload.py's 50M model, vocab 32000):
  - decode steps at batch 64 with every row constrained: the mask fill + apply time over the step time;
  - a typical schema through the compile service (child process + serialization), cold and cached.
A grammar engine that is not installed is left out of part 1 (the JSON says so). Writes --out (default
benchmarks/results/structured_outputs.json).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import bench_model_dir  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path(os.environ.get("CONVEYOR_BENCH_CACHE", "/tmp/conveyor-bench"))

TYPICAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9.]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
        "status": {"enum": ["active", "inactive", "banned"]},
    },
    "required": ["name", "age", "email", "tags", "address", "status"],
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["math", "poetry", "engines"],
    "address": {"city": "London", "zip": "12345"},
    "status": "active",
}


def schema_variant(i: int) -> str:
    return json.dumps({**TYPICAL, "title": f"variant {i} {time.time_ns()}"})


def bpe_32k():
    """A 32000-token byte-level BPE trained on the standard library's sources (real merges, not padding)."""
    from transformers import PreTrainedTokenizerFast

    from engine.tiny_model import train_byte_level_bpe

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:150]
    tok = train_byte_level_bpe(32000, ["<s>", "</s>"], files=files)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def tiny_tokenizer():
    from transformers import AutoTokenizer

    from engine.tiny_model import make_tiny_model

    path = CACHE / "tiny-llama"
    if not (path / "config.json").exists():
        make_tiny_model(path)
    return AutoTokenizer.from_pretrained(str(path))


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 4)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr, self.vocab = xgr, vocab
        t = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab, stop_token_ids=[tokenizer.eos_token_id]
        )
        self.init_s = time.perf_counter() - t
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema, any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int):
        return self.xgr.allocate_token_bitmask(rows, self.vocab)

    def fill(self, matcher, bitmask, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def apply(self, logits, bitmask) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll, self.llt, self.vocab = llguidance, llguidance.torch, vocab
        t = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.init_s = time.perf_counter() - t

    def compile(self, schema: str):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        # llguidance compiles lazily: the matcher is the compiled form (first mask is part of the cost).
        matcher = self.ll.LLMatcher(self.tok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        bitmask = self.bitmask(1)
        self.fill(matcher, bitmask, 0)
        return grammar

    def matcher(self, compiled):
        return self.ll.LLMatcher(self.tok, compiled)

    def bitmask(self, rows: int):
        return self.llt.allocate_token_bitmask(rows, self.vocab)

    def fill(self, matcher, bitmask, row: int) -> None:
        self.llt.fill_next_token_bitmask(matcher, bitmask, row)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def apply(self, logits, bitmask) -> None:
        self.llt.apply_token_bitmask_inplace(logits, bitmask)


def measure_engine(cls, tokenizer, vocab: int, tokens: list[int], repeats: int) -> dict:
    eng = cls(tokenizer, vocab)
    compile_s = []
    for i in range(repeats):
        t = time.perf_counter()
        compiled = eng.compile(schema_variant(i))
        compile_s.append(time.perf_counter() - t)
    # One matcher through a whole valid instance: fill before each token, then accept it.
    m = eng.matcher(compiled)
    bitmask = eng.bitmask(1)
    fills = []
    for token in tokens:
        t = time.perf_counter()
        eng.fill(m, bitmask, 0)
        fills.append(time.perf_counter() - t)
        assert eng.accept(m, token), f"{eng.name} rejected token {token}"
    # Batch 64: matchers spread over the instance, so rows ask for different masks.
    matchers = []
    for row in range(64):
        mm = eng.matcher(compiled)
        for token in tokens[: row * len(tokens) // 64]:
            eng.accept(mm, token)
        matchers.append(mm)
    logits = torch.randn(64, vocab)
    steps, applies = [], []
    for _ in range(4 * repeats):
        bm = eng.bitmask(64)
        t = time.perf_counter()
        for row, mm in enumerate(matchers):
            eng.fill(mm, bm, row)
        t1 = time.perf_counter()
        eng.apply(logits, bm)
        t2 = time.perf_counter()
        steps.append(t2 - t)
        applies.append(t2 - t1)
    return {
        "tokenizer_init_ms": _ms(eng.init_s),
        "compile_cold_ms_median": _ms(statistics.median(compile_s)),
        "fill_per_token_us_mean": round(statistics.mean(fills) * 1e6, 2),
        "batch64_fill_and_apply_ms_median": _ms(statistics.median(steps)),
        "batch64_apply_only_ms_median": _ms(statistics.median(applies)),
        "instance_tokens": len(tokens),
    }


def installed(cls) -> bool:
    try:
        __import__(cls.name)
    except ImportError:
        print(f"{cls.name} is not installed: left out")
        return False
    return True


def part1(quick: bool) -> dict:
    out: dict = {}
    engines = [cls for cls in (XGrammar, LLGuidance) if installed(cls)]
    tokenizers = [("tiny-512", tiny_tokenizer)] + ([] if quick else [("bpe-32000", bpe_32k)])
    for label, make in tokenizers:
        tokenizer = make()
        vocab = len(tokenizer)
        tokens = tokenizer.encode(json.dumps(INSTANCE), add_special_tokens=False)
        out[label] = {
            cls.name: measure_engine(cls, tokenizer, vocab, tokens, 1 if quick else 5) for cls in engines
        }
        out[label].update({cls.name: "not installed" for cls in (XGrammar, LLGuidance) if cls not in engines})
        print(label, json.dumps(out[label], indent=1))
    return out


def part2(quick: bool) -> dict:
    """xgrammar inside LLMEngine on the 50M benchmark model: mask cost over the decode step at batch 64
    (quick: the tiny model at batch 4)."""
    from engine import LLMEngine, SamplingParams
    from engine.structured import batch_mask
    from engine.structured.spec import GrammarSpec

    model = CACHE / "tiny-llama" if quick else bench_model_dir(CACHE)
    if quick and not (model / "config.json").exists():
        tiny_tokenizer()  # makes the tiny model
    batch = 4 if quick else 64
    engine = LLMEngine(str(model), max_num_seqs=batch, num_kv_blocks=1024, block_size=16, device="cpu")
    mask_seconds: list[float] = []
    original = batch_mask.apply_grammar_masks

    def timed(logits, rows, vocab_size):
        t = time.perf_counter()
        out = original(logits, rows, vocab_size)
        if rows:
            mask_seconds.append(time.perf_counter() - t)
        return out

    batch_mask.apply_grammar_masks = timed
    # 16 digits: every row stays in the batch for the whole run, constrained at every step.
    digits = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 16,
        "maxItems": 16,
    }
    prompts = [[5 + i, 100 + i, 200 + i, 300 + i] for i in range(batch)]

    def run(params: SamplingParams) -> list[float]:
        for i, p in enumerate(prompts):
            engine.add_request(f"r{time.time_ns()}-{i}", p, params)
        steps = []
        while engine.has_unfinished_requests():
            engine.step()
            if engine.scheduler.stats().num_running == batch and len(engine.scheduler.running) == batch:
                steps.append(engine.runner.last_step_seconds)
        return steps[2:]  # past the prefill

    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=100, temperature=0, structured_outputs={"json": digits})
    run(SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    free_steps = run(free)
    mask_seconds.clear()
    constrained_steps = run(constrained)
    service = engine.structured.service
    cold = []
    for i in range(2 if quick else 5):
        t = time.perf_counter()
        service.compile(GrammarSpec("json", schema_variant(100 + i))).result()
        cold.append(time.perf_counter() - t)
    spec = GrammarSpec("json", schema_variant(100))
    t = time.perf_counter()
    service.compile(spec)
    cached = time.perf_counter() - t
    engine.structured.close()
    step = statistics.median(free_steps)
    mask = statistics.median(mask_seconds)
    return {
        "model": "the tiny model (vocab 512)"
        if quick
        else "benchmarks/workload.py BENCH_MODEL (50M, vocab 32000, random tokenizer)",
        "batch": batch,
        "decode_step_ms_median_unconstrained": _ms(step),
        "decode_step_ms_median_all_constrained": _ms(statistics.median(constrained_steps)),
        "mask_fill_and_apply_ms_median": _ms(mask),
        "mask_share_of_unconstrained_step": round(mask / step, 4),
        "service_compile_cold_ms_median": _ms(statistics.median(cold)),
        "service_compile_cached_ms": _ms(cached),
        "steps_measured": [len(free_steps), len(constrained_steps)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", help="1, 2 or both (the default)")
    ap.add_argument("--quick", action="store_true", help="the tiny tokenizer only, the tiny model at batch 4")
    ap.add_argument("--out", type=Path, default=RESULTS / "structured_outputs.json")
    args = ap.parse_args()
    parts = args.parts or ["1", "2"]
    if set(parts) - {"1", "2"}:
        ap.error(f"parts are 1 and 2, not {' '.join(parts)}")
    torch.manual_seed(0)
    result = {"cpu": _cpu(), "torch_threads": torch.get_num_threads(), "quick": args.quick}
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():  # running one part keeps the other's last figures
        result = {**json.loads(path.read_text()), **result}
    if "1" in parts:
        result["part1_grammar_engines"] = part1(args.quick)
    if "2" in parts:
        result["part2_engine_xgrammar"] = part2(args.quick)
        print(json.dumps(result["part2_engine_xgrammar"], indent=1))
    try:
        import llguidance
        import xgrammar

        result["versions"] = {"xgrammar": xgrammar.__version__, "llguidance": llguidance.get_version()}
    except Exception:  # a version string is nice to have, not needed
        pass
    path.write_text(json.dumps(result, indent=1) + "\n")


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
