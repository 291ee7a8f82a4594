"""Feature Deletion (Composer's synthetic agent task): delete a function from a repository
whose tests pass, and have the agent rebuild it; the tests are the reward.

* ``candidates``: which functions can be deleted, and the deletion.
* ``source``: source trees (a directory, or a PyPI sdist fetched at generation time).
* ``generate``: the parallel, resumable, cached task generator.
* ``workspace``: an episode's repository copy and the check of what the agent changed.
* ``grade``: grading that only the target file reaches, with static and run-time checks.
* ``env``: the tool environment (``feature_deletion`` in the registry).
"""
