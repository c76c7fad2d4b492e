"""The terminal progress bar of `conveyor batch`: done / failed / total, tokens per second, ETA (tqdm).

Off when stderr is not a terminal (tqdm's `disable=None`), so logs and CI output stay clean.
"""

from __future__ import annotations

import time


class Progress:
    def __init__(self, total: int, already_done: int, enabled: bool | None = None) -> None:
        from tqdm import tqdm

        self.done = self.failed = self.tokens = 0
        self._start = time.monotonic()
        self._bar = tqdm(
            total=total, initial=already_done, unit="req", disable=None if enabled is None else not enabled
        )
        self._refresh()

    def finished(self, ok: bool, tokens: int) -> None:
        if ok:
            self.done += 1
        else:
            self.failed += 1
        self.tokens += tokens
        self._bar.update(1)
        self._refresh()

    def close(self) -> None:
        self._bar.close()

    def _refresh(self) -> None:
        rate = self.tokens / max(time.monotonic() - self._start, 1e-9)
        self._bar.set_postfix_str(f"done={self.done} failed={self.failed} tok/s={rate:.0f}", refresh=False)
