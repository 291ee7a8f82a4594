"""Unmodified agent harnesses trained through a proxy: an OpenAI-compatible endpoint served
by the policy that records each request's tokens (``proxy``), the agent process run per episode
in the bubblewrap sandbox with only the proxy reachable (``sandboxed``), the recorded turns
joined into one training sequence (``align``), and TRL's ``rollout_func`` over Feature
Deletion episodes (``episodes``). docs/agents.md, "Proxy for unmodified agents"."""
