"""`conveyor serve` freezes its start-up heap before serving (worker/gateway/serve.py): what the app was
built from is out of the collector's reach by the time uvicorn takes requests."""

from __future__ import annotations

import gc

from worker.gateway import serve
from worker.gateway.settings import GatewaySettings


def test_the_start_up_heap_is_frozen_before_uvicorn_serves(monkeypatch):
    seen: dict[str, int] = {}

    def fake_uvicorn_run(app, **options) -> None:
        seen["frozen"] = gc.get_freeze_count()
        seen["app_frozen"] = not any(app is o for o in gc.get_objects())

    monkeypatch.setattr(serve.uvicorn, "run", fake_uvicorn_run)
    gc.unfreeze()
    try:
        serve.run(GatewaySettings(port=0))
    finally:
        gc.unfreeze()  # the rest of this test process collects as usual
    assert seen["frozen"] > 10_000  # the modules, routes and models, not a handful of objects
    assert seen["app_frozen"]  # the app itself: frozen objects are in no generation get_objects lists
