"""Grammar compiler service: compiles off the step loop, caches by GrammarSpec, stops slow compiles.

`compile(spec)` returns at once with a Future of an `xgrammar.CompiledGrammar`; one background thread feeds
the compile process (compile_process.py) one spec at a time and deserializes its answer against this
engine's TokenizerInfo. Futures are cached (LRU), failed ones too, so a repeated schema is free and a
repeated bad one fails at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from engine.structured.compile_process import CompileProcess, GrammarError, clean_message
from engine.structured.spec import GrammarSpec
from engine.structured.xgrammar_compile import check_spec


class GrammarCompilerService:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Iterable[int],
        timeout_s: float = 10.0,
        cache_size: int = 256,
    ) -> None:
        """tokenizer: a transformers tokenizer; vocab_size: the LM head's width (the mask's width, which
        can exceed the tokenizer's: xgrammar never allows the ids it has no token for)."""
        import xgrammar as xgr

        self._xgr = xgr
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids)
        )
        self.vocab_size = vocab_size
        self.process = CompileProcess(self.tokenizer_info.serialize_json(), timeout_s)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="conveyor-grammar")
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def check(self, spec: GrammarSpec) -> None:
        """Raise GrammarError with the grammar engine's message when the spec is invalid (no compile)."""
        try:
            check_spec(spec)
        except Exception as exc:
            raise GrammarError(f"invalid {spec.kind}: {clean_message(exc)}") from None

    def compile(self, spec: GrammarSpec) -> Future:
        with self._lock:
            future = self._cache.get(spec)
            if future is not None:
                self._cache.move_to_end(spec)
                return future
            future = self._pool.submit(self._compile, spec)
            self._cache[spec] = future
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.process.close()

    def _compile(self, spec: GrammarSpec) -> Any:
        payload = self.process.compile(spec)
        try:
            return self._xgr.CompiledGrammar.deserialize_json(payload, self.tokenizer_info)
        except Exception as exc:
            raise GrammarError(f"could not load the compiled grammar: {clean_message(exc)}") from None
