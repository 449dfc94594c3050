"""quant."""
