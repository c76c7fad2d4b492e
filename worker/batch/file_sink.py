"""`conveyor batch`'s sink: lines appended to a local output file (and the failed ones to an errors file),
a progress bar; a rerun resumes from what the output file holds (worker/batch/resume.py)."""

from __future__ import annotations

from typing import IO, Any

from worker.batch.progress import Progress
from worker.batch.resume import Answered, read_answered
from worker.batch.sink import Stop
from worker.fleet.batch_board import BatchBoard


class FileSink:
    def __init__(self, output_path: str, errors_path: str | None, progress: bool | None = None) -> None:
        self._answered = read_answered(output_path)
        self._progress = progress
        self.bar: Progress | None = None
        self._board_at: tuple[Any, str, str] | None = None
        self.board: BatchBoard | None = None
        self._skipped = 0
        self._out: IO[str] = open(output_path, "a", encoding="utf-8")
        self._errors: IO[str] | None = open(errors_path, "a", encoding="utf-8") if errors_path else None

    def answered(self) -> Answered:
        return self._answered

    def write(self, custom_id: str, line: str, ok: bool, tokens: int) -> None:
        # One write of a whole line, then flush: a crash leaves whole lines (or a last partial one that
        # resume.py cuts off).
        self._out.write(line)
        self._out.flush()
        if not ok and self._errors is not None:
            self._errors.write(line)
            self._errors.flush()
        if self.bar is not None:
            self.bar.finished(ok, tokens)
            if self.board is not None:
                self.board.update(self._skipped + self.bar.done, self.bar.failed)

    def show_on(self, client: Any, key: str, name: str) -> None:
        """Keep the run's progress on the batch board (`conveyor top`, the dashboard) under `name`."""
        self._board_at = (client, key, name)

    def started(self, total: int, skipped: int) -> None:
        self.bar = Progress(total, skipped, self._progress)
        self._skipped = skipped
        if self._board_at is not None:
            self.board = BatchBoard(*self._board_at, total)
            self.board.update(skipped, 0, force=True)

    def stop(self) -> Stop | None:
        return None

    def close(self) -> None:
        self._out.close()
        if self._errors is not None:
            self._errors.close()
        if self.bar is not None:
            self.bar.close()
        if self.board is not None:
            self.board.close()
