"""Asynchronous rollouts on Ray (``rollout.engine: ray``; docs/scaling.md).

``group``: the record a rollout worker streams to the learner (the contract with later
stages); ``dispenser``: the learner-owned, seeded and resumable order of training tasks;
``worker``: a rollout worker (a Ray actor generating with the shared generator,
lm/generator.py); ``hub``: the actor between workers and learner (tickets, finished groups,
weight versions); ``learner``: the learner's side (Ray's lifecycle, weight pushes, groups
turned into TRL's batch rows, staleness). Imports of torch and ray stay inside the modules that
need them."""
