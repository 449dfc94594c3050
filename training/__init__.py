"""Training of the embedded default model (``docs/default_model.md``): run its scripts from the repository root as
modules, e.g. ``python -m training.default_model_v2.train``."""
