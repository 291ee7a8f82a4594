"""Our recipe on verl 0.9 (Ray; the scale path for many GPUs).

* :mod:`.plugin` (imports verl): registers the advantage estimator ``composer_grpo``, the policy
  loss ``composer_dapo`` and the distillation loss ``composer_sdpo`` with verl's registries;
  verl loads it through our ``verl.plugins`` entry point at ``import verl``.
* :mod:`.agent_loop` (imports verl): agent-loop managers whose teacher is the policy itself
  scoring a failed rollout with the verifier's feedback as a hint (SDPO/OPSD).
* :mod:`.algos`, :mod:`.hinted`: the verl-free pieces (group advantages; the hinted teacher's
  token rows), :mod:`.reward` (``compute_score`` for verl's custom reward hook) and
  :mod:`.data` (our arithmetic task as verl parquet).
* ``composer_grpo.yaml``: the run config (``python -m verl.trainer.main_ppo --config-path
  <this folder> --config-name composer_grpo``).

Channel 3 (replay preferences) has no place in verl's PPO data path (one rollout batch, one
policy loss, one distillation loss): run it with our TRL trainer. verl 0.9 pins transformers
< 5.11, which our TRL pin excludes, so it lives in its own environment
(``pip install composer-replication[verl]`` there). See docs/recipes.md.
"""
