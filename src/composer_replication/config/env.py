"""The ``env:`` section, keyed on the environment's ``name``: each environment's options in a
class of its own (unknown keys rejected per environment), plus the sandbox and tool-rollout
sections. An environment registered from outside (``envs.register_env(name, factory,
config=MyEnvConfig)``) adds its options class here through :func:`register_env_config`, so a
YAML names it like a built-in one. Imports no torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from composer_replication.config.base import StrictModel

ARITHMETIC_LEVELS = (1, 2, 3, 4, 5, 6, 7)
"""The arithmetic environment's difficulty levels (envs/arithmetic.py defines each)."""


def requirement_problem(text: object) -> str | None:
    """Why ``text`` is not a plain PEP 508 requirement by name (``freezegun>=1.2``), or None.
    A test requirement reaches ``pip install`` on the host: a string starting with ``-`` is a
    pip option (``-e ./dir``, ``-r file``, ``--index-url``), a path or URL (``pkg @ file:...``)
    names an sdist whose build would run there (issue 55)."""
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a string"
    if not text.strip() or text.lstrip().startswith("-") or len(text) > 500:
        return "is empty, too long or a pip option (starts with '-')"
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - packaging comes with pytest and transformers
        return "cannot be checked: the `packaging` package is not installed"
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        return f"is not a PEP 508 requirement ({str(e).splitlines()[0]})"
    if req.url:
        return "names a URL or path, not a package of the index"
    return None


class TaskGenConfig(StrictModel):
    """Feature Deletion task generation (``composer-replication tasks generate``;
    envs/feature_deletion/generate.py)."""

    max_break_share: float = Field(0.5, gt=0.0, le=1.0)
    """A deletion that fails more than this share of the suite's passing tests is too broad
    to be a task (it deletes a foundation, not a feature)."""
    visible_tests: int = Field(3, ge=1, le=1000)
    """Failing tests the agent may see and run by name; the task's other failing tests stay
    hidden until grading."""
    workers: int = Field(0, ge=0, le=256)
    """Sandboxed suite runs in parallel (0: one per CPU core). Not part of the task set's
    identity."""
    suite_timeout_s: float = Field(120.0, gt=0.0, le=3600.0)
    """Wall-clock (and CPU-seconds) limit of one run of the suite."""
    memory_mb: int = Field(2048, ge=256, le=65536)
    """Address-space limit of one run of the suite."""
    screen_test_timeout_s: float = Field(10.0, ge=0.1, le=3600.0)
    """The triviality screen's limit for one test under one trivial body (screen.py): a body
    that makes a test loop (a lexer whose ``_consume`` returns None) fails that test at the
    limit, and the screen goes on, instead of the screening run reaching the suite's timeout
    (``screen_failed``: a lost candidate, and 240 s of a sandbox slot)."""
    max_candidates: int | None = Field(None, ge=1)
    """Try only the first N candidate functions (file order); None: all."""
    time_limit_s: float | None = Field(None, gt=0.0, le=7 * 86400.0)
    """Start no candidate run this many seconds after generation began (a suite: after the
    suite began); the runs in flight end, the task set is written from the candidates tried,
    and a re-run continues with the rest. None: no limit. Not part of the task set's
    identity."""
    test_requirements: list[str] = Field(default_factory=list)
    """The suite's own test dependencies (PEP 508 requirements by name, e.g. ``freezegun``;
    no pip option, path or URL), installed next to pytest for the sandboxed runs from the
    package index as binary wheels only (an sdist's build would run on the host)."""

    @field_validator("test_requirements")
    @classmethod
    def _plain_requirements(cls, value: list[str]) -> list[str]:
        for text in value:
            if (problem := requirement_problem(text)) is not None:
                raise ValueError(f"test requirement {text!r} {problem}")
        return value

    rename_package: bool = False
    """Rename the source's top-level package (and every word-boundary mention of it) to a
    name derived from the tree's hash, so a model cannot lean on memorized upstream code
    (the suite must still pass after the rename)."""


class SandboxConfig(StrictModel):
    """Where and how model-written code runs (sandbox/sandbox.py, docs/sandbox.md)."""

    unsafe_run_without_isolation: bool = False
    """Run model-written code without bubblewrap (limits and an audit hook only); the code can
    then read this user's files and environment. Only for machines that cannot run bwrap."""
    workers: int = Field(0, ge=0, le=256)
    """Sandbox slots: sandboxes running at once in this process, tool calls and gradings
    together (0 = one per CPU core, fewer if the available memory holds fewer)."""
    slot_wait_s: float = Field(600.0, gt=0, le=86400)
    """Longest wait for a sandbox slot before a grading or tool call starts; past it the
    grading is the machine's failure (``slot_timeout``, masked; docs/sandbox.md)."""
    wall_timeout_s: float = Field(5.0, gt=0, le=600)
    """Wall-clock limit of one grading (interpreter start, loading and every test call)."""
    cpu_time_s: int = Field(5, ge=1, le=600)
    """CPU-seconds limit of the sandboxed process (RLIMIT_CPU)."""
    memory_mb: int = Field(512, ge=64, le=65536)
    """Address-space limit of each sandboxed process (RLIMIT_AS)."""
    file_size_mb: int = Field(16, ge=1, le=4096)
    """Largest file the code may write (RLIMIT_FSIZE)."""
    work_dir_mb: int = Field(64, ge=1, le=65536)
    """Size of the private tmpfs work directory, the only writable place."""
    max_processes: int = Field(1, ge=1, le=4096)
    """Processes and threads the code may have at once (RLIMIT_NPROC, per sandbox). 1: none
    can be started, even through a call the audit hook does not see (each child would get a
    memory limit of its own); a test suite that starts processes needs more."""
    max_output_kb: int = Field(64, ge=1, le=65536)
    """stdout/stderr bytes kept from a run (the rest is read and dropped)."""
    audit_hook: bool = True
    """Also install the in-process audit hook (a second layer under the OS isolation)."""


class EnvConfig(StrictModel):
    """Options every environment has; a variant per environment adds its own."""

    name: str = "arithmetic"
    """Registered environment (built in: ``arithmetic``, ``humaneval``, ``calculator``,
    ``feature_deletion``; see envs/). ``calculator`` and ``feature_deletion`` are multi-turn
    tool tasks (bounded by the ``rollout`` section; docs/agents.md, docs/feature_deletion.md).
    Setting ``env.name`` on the command line starts the section afresh: the file's options
    of another environment do not carry over (other ``env.*`` overrides still apply)."""
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Fraction of problems reserved for the held-out split (disjoint from train)."""
    num_train: int = Field(2000, ge=1)
    """Number of training prompts drawn from the train split."""
    seed: int = 0
    """Seed for drawing problems (the split itself is a fixed hash, independent of seeds)."""

    @classmethod
    def variants(cls) -> tuple[type[EnvConfig], ...]:
        """The registered options classes (what ``env:`` may be)."""
        return tuple(ENV_CONFIGS.values())

    def env_options(self, sandbox: SandboxConfig) -> dict[str, Any]:
        """Keyword options of the environment's factory: every field but the run-level ones
        (``name``, ``num_train``, ``seed``), by field name. ``sandbox`` is the run's sandbox
        section, for an environment that grades code in it."""
        skip = {"name", "num_train", "seed"}
        return {k: getattr(self, k) for k in type(self).model_fields if k not in skip}


class ArithmeticEnvConfig(EnvConfig):
    """Arithmetic problems over difficulty levels (envs/arithmetic.py)."""

    name: Literal["arithmetic"] = "arithmetic"
    levels: list[int] = Field(default_factory=lambda: [1, 2])
    """Difficulty levels mixed in the train and held-out splits (see envs/arithmetic.py)."""

    @model_validator(mode="after")
    def _check_levels(self) -> ArithmeticEnvConfig:
        bad = [lv for lv in self.levels if lv not in ARITHMETIC_LEVELS]
        if bad or not self.levels:
            raise ValueError(f"env.levels: {bad or 'empty'} not in {list(ARITHMETIC_LEVELS)}")
        return self


class HumanEvalEnvConfig(EnvConfig):
    """HumanEval's 164 problems, graded in the sandbox (the ``sandbox`` section)."""

    name: Literal["humaneval"] = "humaneval"

    def env_options(self, sandbox: SandboxConfig) -> dict[str, Any]:
        return {"heldout_fraction": self.heldout_fraction, "sandbox": sandbox}


class ToolEnvConfig(EnvConfig):
    """Options every tool environment has."""

    openenv_url: str | None = None
    """Run the tools and the grading on this OpenEnv server (ours served with ``python -m
    composer_replication.envs.openenv.server``, or any OpenEnv tool environment) through the
    generic adapter (envs/openenv/adapter.py); prompts still come from ``name``'s tasks.
    None = tools run in this process."""
    few_shot: bool = True
    """Put worked tool exchanges before each task (the 135M base model never calls a tool from
    the schema alone; docs/agents.md)."""
    max_tool_output_chars: int = Field(2000, ge=100, le=1_000_000)
    """Tool results are cut to this many characters (feature_deletion's tools, and any OpenEnv
    server's)."""


class CalculatorEnvConfig(ToolEnvConfig):
    """Arithmetic with a calculator tool (envs/calculator.py)."""

    name: Literal["calculator"] = "calculator"
    shots: int = Field(2, ge=0, le=2)
    """With ``few_shot``: how many of the two worked exchanges precede each task. The base
    135M model passes greedily 100% with 2 and 3% with 1 (T=1: 6% and 0%; docs/agents.md), so
    1 is the sparse-reward variant."""

    @model_validator(mode="after")
    def _shots_need_few_shot(self) -> CalculatorEnvConfig:
        if self.shots != 2 and not self.few_shot:
            raise ValueError(f"env.shots={self.shots}: shots need few_shot=true")
        return self

    def env_options(self, sandbox: SandboxConfig) -> dict[str, Any]:
        return {"heldout_fraction": self.heldout_fraction, "few_shot": self.few_shot,
                "shots": self.shots}  # fmt: skip


class MemoryEnvConfig(ToolEnvConfig):
    """Drawers opened one per turn; the answer needs the first drawer's key and the last
    drawer's offset (envs/memory.py): a task for ``rollout.context`` (docs/summarization.md)."""

    name: Literal["memory"] = "memory"
    few_shot: bool = False
    """One worked exchange (3 short drawers, envs/memory.py ``worked_exchange``) before each
    task: the base 135M model calls no tool without it (docs/summarization.md)."""
    shot_summary: bool = False
    """With ``few_shot``: the worked exchange shows a summary turn after its drawer 2 (the
    ``rollout.context`` default summary prompt and header, the key carried in the summary)."""
    answer: Literal["copy", "sum"] = "copy"
    """``copy``: the answer is the key, a dash, the code (``4821-37``: both facts copied);
    ``sum``: the key plus the code (``4858``: the model adds them in its head)."""
    sequential: bool = False
    """The tool is ``open_next_drawer()`` (drawer 1, then 2, ...: the order cannot go wrong)
    instead of ``open_drawer(number)``."""
    drawers: int = Field(6, ge=2, le=64)
    """Drawers per task (one tool call each): drawer 1 holds the key, the last the code."""
    filler_words: int = Field(40, ge=0, le=1000)
    """Filler words in every drawer: what makes the episode outgrow its window."""
    opens_after_summary: bool = False
    """With ``sequential`` and ``rollout.context.strategy: summarize``: right after each
    summary the environment opens the next drawer itself, and the window the summary opens
    shows the summary, then that drawer's text (one user message; the worked exchange of
    ``shot_summary`` is unchanged). The policy opens drawer 1, writes the summary (the key
    must be in it) and answers; the code is only seen after the summary, the key only
    through it. False: the policy opens every drawer (the 135M base model scores 0: after
    a summary it writes text instead of the call, docs/summarization.md). No effect under
    ``truncate`` (no summary)."""

    @model_validator(mode="after")
    def _shot_summary_needs_few_shot(self) -> MemoryEnvConfig:
        if self.shot_summary and not self.few_shot:
            raise ValueError("env.shot_summary=true: the summary turn is part of few_shot")
        if self.opens_after_summary and not self.sequential:
            raise ValueError("env.opens_after_summary=true needs env.sequential=true (the "
                             "environment opens the next drawer with open_next_drawer)")  # fmt: skip
        return self

    def env_options(self, sandbox: SandboxConfig) -> dict[str, Any]:
        return {"heldout_fraction": self.heldout_fraction, "drawers": self.drawers,
                "filler_words": self.filler_words, "few_shot": self.few_shot,
                "answer": self.answer, "shot_summary": self.shot_summary,
                "sequential": self.sequential,
                "opens_after_summary": self.opens_after_summary}  # fmt: skip


class FeatureDeletionEnvConfig(ToolEnvConfig):
    """Restore functions deleted from real repositories (envs/feature_deletion/)."""

    name: Literal["feature_deletion"] = "feature_deletion"
    task_sources: list[str] = Field(
        default_factory=lambda: ["toolz==1.2.0", "inflection==0.5.1"], min_length=1
    )
    """Source trees to delete functions from: local directories with a pytest suite, or
    pinned PyPI packages (``name==version``, the sdist is fetched with pip at first use). Task
    sets are generated at first use and cached (``task_dir``)."""
    task_dir: str | None = None
    """Where generated task sets live (None: the cache, ``<cache>/feature_deletion/tasks``)."""
    task_generation: TaskGenConfig = Field(default_factory=lambda: TaskGenConfig())
    """Task generation and test-run limits (``tasks generate``)."""
    reward: Literal["all_or_nothing", "fraction"] = "all_or_nothing"
    """1 iff every target test passes and nothing regresses, or the share of target tests
    passing (0 on any regression)."""
    tests_budget_s: float | None = Field(300.0, ge=1.0, le=36_000.0)
    """Wall seconds the ``run_tests`` calls of one episode may take in all (each run is cut
    to what is left; once spent, ``run_tests`` is an error result and grading still runs). A
    workspace that hangs costs this once, not ``task_generation.suite_timeout_s`` per call.
    None: no budget."""
    min_hidden_tests: int = Field(0, ge=0, le=1000)
    """Train and evaluate only on tasks with at least this many hidden target tests (test ids
    the agent's workspace does not hold). A task whose every target test is visible can be
    passed by a lookup table of the visible tests' expected values; 1 rules that out (the
    shipped ``feature_deletion.yaml`` sets it; 0 keeps every generated task)."""
    tool_profile: Literal["native", "claude_code", "codex", "bash"] = "native"
    """The tool vocabulary the agent gets (envs/profiles.py, docs/agents.md): the
    environment's own tools, Claude Code's (``Read``, ``Write``, ``Edit``, ``Bash``, ``Grep``,
    ``Glob``), Codex CLI's (``shell``, ``apply_patch``) or one ``bash`` tool, over the same
    workspace, bounds, flags and grading. Shell tools run under the sandbox and spend
    ``tests_budget_s``."""

    @model_validator(mode="after")
    def _profile_runs_here(self) -> FeatureDeletionEnvConfig:
        if self.tool_profile != "native" and self.openenv_url:
            raise ValueError(
                f"env.tool_profile={self.tool_profile}: tool profiles wrap the tools of a workspace in "
                f"this process, not an OpenEnv server's (openenv_url={self.openenv_url!r})"
            )
        return self

    def env_options(self, sandbox: SandboxConfig) -> dict[str, Any]:
        return {"sources": self.task_sources, "task_dir": self.task_dir,
                "generation": self.task_generation, "reward": self.reward,
                "heldout_fraction": self.heldout_fraction,
                "max_output_chars": self.max_tool_output_chars, "few_shot": self.few_shot,
                "tests_budget_s": self.tests_budget_s, "tool_profile": self.tool_profile,
                "min_hidden_tests": self.min_hidden_tests}  # fmt: skip


ENV_CONFIGS: dict[str, type[EnvConfig]] = {
    c.model_fields["name"].default: c
    for c in (ArithmeticEnvConfig, HumanEvalEnvConfig, CalculatorEnvConfig,
              FeatureDeletionEnvConfig, MemoryEnvConfig)
}  # fmt: skip
"""Options class per environment name (``register_env_config`` adds one)."""


def register_env_config(name: str, cls: type[EnvConfig]) -> None:
    """Let ``env: {name: NAME, ...}`` validate with ``cls`` (a subclass of `EnvConfig` whose
    ``name`` field is ``Literal[NAME]``); names are unique."""
    if not (isinstance(cls, type) and issubclass(cls, EnvConfig)):
        raise TypeError(f"env config for {name!r}: {cls!r} is not a subclass of EnvConfig")
    if cls.model_fields["name"].default != name:
        raise ValueError(f"env config for {name!r}: its `name` field defaults to "
                         f"{cls.model_fields['name'].default!r}")  # fmt: skip
    if ENV_CONFIGS.get(name, cls) is not cls:
        raise ValueError(f"environment {name!r} already has options {ENV_CONFIGS[name]!r}")
    ENV_CONFIGS[name] = cls


def env_config(data: Any) -> Any:
    """The options of the environment ``data`` names, validated by its class (``name``
    defaults to ``arithmetic``); already-built options pass through."""
    if not isinstance(data, dict):
        return data
    name = data.get("name", "arithmetic")
    if name not in ENV_CONFIGS:
        raise ValueError(
            f"env.name: unknown environment {name!r}; known: {', '.join(sorted(ENV_CONFIGS))}"
        )
    cls = ENV_CONFIGS[name]
    return cls.model_validate({k: v for k, v in data.items() if not _old_default(cls, k, v)})


def _old_default(cls: type[EnvConfig], key: str, value: Any) -> bool:
    """True for another environment's option at its default: what a section written before
    ``env`` became a union (every environment's options in one mapping, as old runs'
    ``config.yaml`` holds them) carries for the environments it does not use."""
    if key in cls.model_fields:
        return False
    for other in ENV_CONFIGS.values():
        field = other.model_fields.get(key)
        if field is not None:
            default = field.get_default(call_default_factory=True)
            if isinstance(default, StrictModel) and isinstance(value, dict):
                return type(default).model_validate(value) == default
            return value == default
    return False


DEFAULT_SUMMARY_PROMPT = (
    "Your context is almost full. Summarize the work so far for yourself: the task, every "
    "fact the tools returned that you still need (exact values), what you have done and what "
    "is left. Write only the summary; it will replace the conversation."
)
"""The user turn that asks the policy for its summary (``rollout.context.summary_prompt``)."""

DEFAULT_SUMMARY_HEADER = "Summary of your work so far (written by you):\n"
"""What precedes the summary in the next window's user message."""


class ContextConfig(StrictModel):
    """A context budget for multi-turn tool rollouts (docs/summarization.md): what happens when
    the next turn would not fit in ``max_tokens``."""

    strategy: Literal["none", "truncate", "summarize"] = "none"
    """``none``: today's loop (TRL's), bounded by ``generation.max_completion_length`` for the
    whole episode. ``truncate``: drop the oldest turns (keeping system + task) when the next
    turn would not fit. ``summarize``: the policy writes a summary in a turn of its own; the
    context becomes system + task + summary and the episode goes on; the summary is trained
    by the episode's reward. With a strategy, ``generation.max_completion_length`` caps each
    turn (not the episode)."""
    max_tokens: int = Field(2048, ge=64, le=1_048_576)
    """Tokens one context window may hold: prompt, turns, tool results, the summary
    instruction and the summary itself."""
    max_summaries: int = Field(4, ge=1, le=64)
    """Summaries per episode (``summarize``). When one more is needed the episode ends and is
    graded as it stands."""
    summary_prompt: str = Field(DEFAULT_SUMMARY_PROMPT, min_length=1, max_length=4000)
    """The user turn asking for the summary; never a policy token."""
    summary_header: str = Field(DEFAULT_SUMMARY_HEADER, max_length=1000)
    """Text before the summary in the next window's user message."""
    summary_max_tokens: int = Field(256, ge=8, le=65_536)
    """Most tokens a summary may have; a longer one is cut there (and counted)."""
    train_summaries: bool = True
    """``summarize``: the summary is a policy token (tool mask 1) in its own window, trained
    by the episode's advantage. False: mask 0 there too (no gradient through summaries: the
    control arm of the summarization study, docs/results.md); the summary still replaces the
    context."""

    @model_validator(mode="after")
    def _room(self) -> ContextConfig:
        if self.strategy == "summarize" and self.summary_max_tokens >= self.max_tokens // 2:
            raise ValueError(
                f"rollout.context.summary_max_tokens={self.summary_max_tokens} must be under "
                f"half of rollout.context.max_tokens={self.max_tokens}: the next window holds "
                "the system prompt, the task and the summary, and still needs room to work"
            )
        return self


class RolloutConfig(StrictModel):
    """Bounds on multi-turn tool rollouts (tool environments; docs/agents.md)."""

    max_turns: int = Field(3, ge=1, le=256)
    """Assistant turns per rollout: after a turn with tool calls, the results are appended
    and the model continues, at most ``max_turns - 1`` times (TRL's
    ``max_tool_calling_iterations``). Calls written in the last turn are not run."""
    max_tool_calls: int = Field(4, ge=0, le=4096)
    """Tool calls run per rollout; later calls get an error result saying the budget is
    used up, without running."""
    concurrent_tools: bool = True
    """Run the tool calls of all rollouts of a turn at once (each rollout's calls in its own
    order), bounded by ``sandbox.workers`` slots for sandboxed tools and ``max_remote_calls``
    for OpenEnv ones; the same messages and rewards as one rollout after another."""
    max_remote_calls: int = Field(32, ge=1, le=1024)
    """OpenEnv calls (tool calls and gradings) in flight at once from this process."""
    # -- asynchronous rollouts (issue 54; docs/scaling.md) --
    engine: Literal["local", "ray"] = "local"
    """``local``: rollouts generated in the trainer's process, each step waiting for them
    (today's behaviour). ``ray``: rollout workers (Ray actors, the ``ray:`` section) generate
    groups while the learner trains, with bounded staleness and off-policy correction."""
    max_staleness: int = Field(4, ge=0, le=1024)
    """Optimizer steps a group's oldest turn may lag behind the learner's policy before the
    group is dropped (and counted); ``rollout.engine: ray`` and TRL's async path."""
    force_staleness: int | None = Field(None, ge=0, le=1024)
    """Workers generate with exactly this many steps old weights (``rollout.engine: ray``;
    tests and experiments). None: whatever the workers hold."""
    context: ContextConfig = Field(default_factory=ContextConfig)
    """A context budget per window and what to do when a turn would not fit: ``truncate`` or
    ``summarize`` (docs/summarization.md)."""
    correction_cap: float = Field(2.0, ge=1.0, le=1000.0)
    """Truncation ``C`` of the behaviour-policy correction ``min(pi_old / pi_behav, C)``
    (AReaL's decoupled PPO; TRL's truncated importance sampling)."""
    correction: bool = True
    """Multiply the loss by the behaviour-policy weight ``min(pi_old / pi_behav, C)``
    (``rollout.engine: ray``). False: the weight is 1 on every token, so stale groups train
    as if sampled by the learner's policy (the ablation of the staleness study,
    docs/benchmarks.md); the learner's pre-update forward still runs, so ``rollout/ratio_*``
    still report what the weight would have been."""
