"""v2 of the embedded default model (a hybrid Qwen3.5-MoE): agent data on top of v1's tasks, training, evaluation."""
