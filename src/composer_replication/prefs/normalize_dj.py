"""The normalization recipe run by data-juicer (Chen et al. 2024, "Data-Juicer: A One-Stop Data
Processing System for Large Language Models", https://github.com/modelscope/data-juicer).

`DJNormalizer` reads the same `NormalizeConfig` as the native backend (one source of truth for
the thresholds), maps each step to a data-juicer 1.6 operator, runs it on the text of each pair's
``chosen`` answer (`answer_text`) and reports the pairs each step dropped in the same
`NormalizeReport`. Install: ``pip install 'composer-replication[datajuicer]'``.

| report key | data-juicer op and parameters | statistic vs the native backend |
| --- | --- | --- |
| ``text_length`` | ``text_length_filter(min_len=min_chars, max_len=max_chars)`` | identical: ``len(text)`` |
| ``word_count`` | ``words_num_filter(min_num=min_words, max_num=max_words, tokenization=False)`` | splits on space, tab and newline only, strips data-juicer's special characters from each token's ends and drops tokens left empty (``"###"``, ``"42"``, ``"-"`` are not words); never more than the native ``\\S+`` count |
| ``special_char_ratio`` | ``special_characters_filter(min_ratio=0, max_ratio=max_special_char_ratio)`` | data-juicer's special set is ASCII punctuation, digits and whitespace plus ~170 listed symbols and every emoji; native counts characters that are neither alphanumeric nor whitespace. On printable ASCII text: ``dj = native + (digits + whitespace) / len`` |
| ``minhash_near_dup`` | ``document_minhash_deduplicator(tokenization="character", window_size=shingle_size, lowercase=True, num_permutations=minhash_num_perm, jaccard_threshold=minhash_threshold)`` | shingles the lower-cased text without collapsing whitespace; its own hash permutations (so borderline pairs can differ); duplicates are clustered transitively (union-find, the first of each cluster kept) where native keeps a text unless it matches an earlier kept one; a text shorter than ``shingle_size`` has no shingles, so all such texts count as duplicates of each other |

Both ranges are closed (``min <= stat <= max``) in both backends. The LSH (bands, rows) are
data-juicer's own optimum (9 x 13 at 0.8 / 128 permutations, the same as datasketch's), computed
once per process. Each op is applied with ``op.run``, the call ``DefaultExecutor.run`` reaches
through ``NestedDataset.process``; skipping those two leaves out config parsing, export and the
process-wide ``multiprocessing.set_start_method`` that ``process`` forces, and gives the
dataset size after each op. Everything runs in this process (``num_proc=1``). Importing
data-juicer's ops imports ray, sets ``RAY_CLIENT_MODE=0`` and replaces every loguru handler with
its own (``data_juicer/__init__.py``); it is imported only when this backend is used.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from .agreement import DPOPair
from .normalize import NormalizeConfig, NormalizeReport, answer_text

INSTALL_HINT = "pip install 'composer-replication[datajuicer]'"
_TEXT, _INDEX = "text", "pair_index"
_IN_PROCESS = {"num_proc": 1, "auto_op_parallelism": False}
_DEDUP_OP = "document_minhash_deduplicator"
FILTER_STEPS = ("text_length", "word_count", "special_char_ratio")


def require_data_juicer() -> None:
    """Raise ImportError naming the extra to install when data-juicer is missing."""
    try:
        import data_juicer  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"normalize backend 'datajuicer' needs data-juicer, which is not importable "
            f"({err}); install the extra: {INSTALL_HINT}"
        ) from err


def dj_recipe(cfg: NormalizeConfig) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """``(report key, {op name: params})`` per step, in order; the dicts are data-juicer
    ``process:`` entries (a ``dj-process`` YAML recipe lists them)."""
    steps: list[tuple[str, dict[str, dict[str, Any]]]] = [
        ("text_length", {"text_length_filter": {"min_len": cfg.min_chars, "max_len": cfg.max_chars}}),
        ("word_count", {"words_num_filter": {"min_num": cfg.min_words, "max_num": cfg.max_words,
                                             "tokenization": False, "lang": "en"}}),
        ("special_char_ratio", {"special_characters_filter": {
            "min_ratio": 0.0, "max_ratio": cfg.max_special_char_ratio}}),
    ]  # fmt: skip
    if cfg.dedup:
        steps.append(("minhash_near_dup", {_DEDUP_OP: {
            "tokenization": "character", "window_size": cfg.shingle_size, "lowercase": True,
            "num_permutations": cfg.minhash_num_perm, "jaccard_threshold": cfg.minhash_threshold,
        }}))  # fmt: skip
    return steps


class DJNormalizer:
    """``DJNormalizer(cfg)(pairs) -> (kept, report)``: `normalize_pairs`'s contract, run by
    data-juicer. ``verbose=False`` silences data-juicer's log lines and ``datasets`` progress
    bars while it runs (its MinHash clustering still prints two tqdm bars)."""

    def __init__(self, cfg: NormalizeConfig | None = None, *, verbose: bool = False) -> None:
        require_data_juicer()
        from data_juicer.ops import load_ops

        self.cfg = cfg or NormalizeConfig()
        self.verbose = verbose
        recipe = dj_recipe(self.cfg)
        self.steps = [name for name, _ in recipe]
        entries = [{op: _run_params(op, params)} for _, e in recipe for op, params in e.items()]
        with self._quiet():
            self.ops = load_ops(entries)

    def __call__(self, pairs: Sequence[DPOPair]) -> tuple[list[DPOPair], NormalizeReport]:
        report = NormalizeReport(input=len(pairs), dropped=dict.fromkeys(self.steps, 0))
        if not pairs:
            return [], report
        ds = _dataset(pairs)
        with self._quiet():
            for name, op in zip(self.steps, self.ops, strict=True):
                before = len(ds)
                ds = op.run(ds)
                report.dropped[name] = before - len(ds)
        kept = [pairs[i] for i in ds[_INDEX]]
        report.kept = len(kept)
        return kept, report

    def stats(self, pairs: Sequence[DPOPair]) -> list[dict[str, float]]:
        """data-juicer's statistics per pair (``text_len``, ``num_words``,
        ``special_char_ratio``), computed by the three filters without filtering."""
        if not pairs:
            return []
        from data_juicer.utils.constant import Fields

        ds = _dataset(pairs)
        with self._quiet():
            for op in self.ops[: len(FILTER_STEPS)]:
                ds = op.run(ds, reduce=False)
        return [dict(s) for s in ds[Fields.stats]]

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        if self.verbose:
            yield
            return
        import datasets
        from loguru import logger

        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        logger.disable("data_juicer")
        try:
            yield
        finally:
            logger.enable("data_juicer")
            if bars:
                datasets.enable_progress_bars()


def _run_params(op: str, params: dict[str, Any]) -> dict[str, Any]:
    params = {**params, **_IN_PROCESS}
    if op == _DEDUP_OP:
        b, r = _lsh_bands(params["jaccard_threshold"], params["num_permutations"])
        params.update(num_bands=b, num_rows_per_band=r)
    return params


@functools.lru_cache(maxsize=8)
def _lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """data-juicer's own optimal LSH (bands, rows per band), the value the op computes when
    none is given; cached because it integrates error rates for every candidate (~1 s)."""
    from data_juicer.ops.deduplicator.document_minhash_deduplicator import optimal_param

    return optimal_param(threshold, num_perm)


def _dataset(pairs: Sequence[DPOPair]):
    from data_juicer.core.data import NestedDataset

    rows = [{_TEXT: answer_text(p.chosen), _INDEX: i} for i, p in enumerate(pairs)]
    return NestedDataset.from_list(rows)
