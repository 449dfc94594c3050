"""Prefill through the slot pool: whole MoE layers double-buffered (``streamer.py``)."""
