"""The HTTP frontend: OpenAI and Anthropic APIs over one ``AsyncLLM`` (one process).

Request path: a protocol handler (``openai/``, ``anthropic/``) validates its own shapes and
converts them to the one internal ``ChatRequest`` (``internal.py``); ``generation.py`` renders
the chat template, checks the context, drives the engine and the chat parsers and yields
events; a per-protocol builder turns those events into SSE frames or one JSON answer (the same
builder for both, so streamed and non-streamed answers agree). ``errors.py`` renders failures in
each API's own shape; ``app.py`` wires routes, auth, health, metrics and engine stats.
"""
