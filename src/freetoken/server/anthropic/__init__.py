"""The Anthropic-compatible routes: messages and count_tokens."""

from __future__ import annotations

from fastapi import APIRouter


def router() -> APIRouter:
    from freetoken.server.anthropic.count_tokens import count_tokens
    from freetoken.server.anthropic.messages import create_message

    r = APIRouter()
    r.add_api_route("/v1/messages", create_message, methods=["POST"])
    r.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"])
    return r
