"""Reasoning parsers: split a model's thinking from its answer (one file per format)."""
