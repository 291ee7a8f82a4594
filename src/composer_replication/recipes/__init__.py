"""Recipes that run our losses inside other engines (their own trainers, their own loops).

* ``recipes.prime_rl``: a custom loss for PRIME-RL's ``[trainer.loss] type = "custom"`` hook
  (example config: ``recipes/prime_rl.toml``).
* ``recipes.verl``: a verl 0.9 plugin (advantage estimator, DAPO loss, hinted self-distillation
  loss, hinted agent-loop managers) and its run config ``recipes/verl/composer_grpo.yaml``.
"""
