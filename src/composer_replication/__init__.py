"""composer-replication: RL post-training for Hugging Face causal LMs (GRPO/DAPO, hint
self-distillation, multi-teacher trace replay, DiLoCo)."""

__version__ = "0.1.0"
