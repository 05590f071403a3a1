"""The partner portal's items service: FastAPI behind ratekeeper's ASGI middleware.

``GET /items/{user}`` is limited by ``rules.yaml`` (one request per 2 s per user).
``POST /items/create`` is not limited, nor is ``GET /unlimited/{user}``: the same handler
as the listing without a rule, the floor the limiter's latency is measured against.
The store is ``PARTNER_PORTAL_STORE`` (default ``memory://``): two instances given the same
PostgreSQL or Redis URL share every user's budget.

    PARTNER_PORTAL_STORE=postgresql://postgres@127.0.0.1:5432/test \
        uvicorn app:app --app-dir examples/partner_portal
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel

from ratekeeper.web import RateLimitMiddleware

RULES = Path(__file__).with_name("rules.yaml")

app = FastAPI(title="partner portal: items")
app.add_middleware(RateLimitMiddleware, rules=str(RULES), store=os.environ.get("PARTNER_PORTAL_STORE", "memory://"))

# In memory and per instance: the demo is about the limiter, not about storing items.
_items: dict[str, list[str]] = {}


class NewItem(BaseModel):
    user: str
    name: str


@app.post("/items/create", status_code=201)
async def create_item(item: NewItem) -> dict[str, str]:
    _items.setdefault(item.user, []).append(item.name)
    return {"user": item.user, "name": item.name}


@app.get("/items/{user}")
async def list_items(user: str) -> dict[str, object]:
    return {"user": user, "items": _items.get(user, [])}


@app.get("/unlimited/{user}")
async def list_items_unlimited(user: str) -> dict[str, object]:
    return await list_items(user)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
