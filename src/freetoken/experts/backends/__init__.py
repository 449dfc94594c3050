"""Expert backends: one file per way of running routed experts, chosen by name (``registry.py``)."""
