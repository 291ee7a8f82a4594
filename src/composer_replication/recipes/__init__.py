"""Recipes that run our losses inside other engines (their own trainers, their own loops).

* ``recipes.prime_rl``: a custom loss for PRIME-RL's ``[trainer.loss] type = "custom"`` hook
  (example config: ``recipes/prime_rl.toml``).
"""
