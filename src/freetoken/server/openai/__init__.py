"""The OpenAI-compatible routes: chat completions, completions, tokenize, responses, models."""

from __future__ import annotations

from fastapi import APIRouter


def router() -> APIRouter:
    from freetoken.server.openai.chat_completions import create_chat_completion
    from freetoken.server.openai.completions import create_completion
    from freetoken.server.openai.models import get_model, list_models
    from freetoken.server.openai.responses import create_response, get_response
    from freetoken.server.openai.tokenize import detokenize, tokenize

    r = APIRouter()
    r.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
    r.add_api_route("/v1/completions", create_completion, methods=["POST"])
    r.add_api_route("/v1/tokenize", tokenize, methods=["POST"])
    r.add_api_route("/v1/detokenize", detokenize, methods=["POST"])
    r.add_api_route("/v1/responses", create_response, methods=["POST"])
    r.add_api_route("/v1/responses/{response_id}", get_response, methods=["GET"])
    r.add_api_route("/v1/models", list_models, methods=["GET"])
    r.add_api_route("/v1/models/{model_id:path}", get_model, methods=["GET"])
    return r
