"""v1 of the embedded default model: synthetic data, tokenizer, training and evaluation."""
