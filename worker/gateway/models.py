"""`GET /v1/models` and `/v1/models/{id}`: the models a live worker serves (OpenAI's model objects)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from worker.gateway.auth import tenant_of
from worker.gateway.errors import model_not_found
from worker.gateway.fleet_view import ServedModel

router = APIRouter(dependencies=[Depends(tenant_of)])


def model_object(m: ServedModel) -> dict:
    return {
        "id": m.name,
        "object": "model",
        "created": min(w.started_ms for w in m.workers) // 1000,
        "owned_by": "conveyor",
        "max_model_len": m.max_model_len,  # vLLM's extension
        "workers": len(m.workers),
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    found = await request.app.state.fleet.models()
    return {"object": "list", "data": [model_object(m) for m in found.values()]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict:
    found = await request.app.state.fleet.models()
    if model not in found:
        found = await request.app.state.fleet.models(fresh=True)
    if model not in found:
        raise model_not_found(model)
    return model_object(found[model])
