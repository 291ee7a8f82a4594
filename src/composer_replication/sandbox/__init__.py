"""Where model-written code runs, and the grading wire, knowing no task: bubblewrap isolation
and limits (``sandbox``), the memory cgroup (``cgroup``), what runs inside (``wire``: the grading wire), a
pinned sandboxed pytest (``pytest_suite``) and the split-grading forward client
(``forward_client``). docs/sandbox.md."""
