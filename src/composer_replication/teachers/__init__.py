"""Teachers: the models a run learns from, described once (config/teachers.py: ``type: local``
or ``type: remote``) and asked in two ways.

* ``chat``: a teacher answers chat requests (trace replay, replay/): :class:`OpenAITeacher`,
  :class:`LocalHFTeacher`, :func:`build_teacher`.
* ``scoring``: a teacher reports its log-probs on given token ids (on-policy distillation,
  channels/distill.py): :class:`LocalScorer`, :class:`RemoteScorer`, the tokenizer check.
* ``edge``: the network edge both share: :class:`TeacherError`, retries with backoff, bounded
  reads. ``local_model``: the in-process chat model (also behind ``composer-replication
  serve``)."""

from composer_replication.teachers.chat import (
    LocalHFTeacher,
    OpenAITeacher,
    Teacher,
    TeacherResponse,
    build_teacher,
)
from composer_replication.teachers.edge import TeacherError
from composer_replication.teachers.scoring import (
    LocalScorer,
    RemoteScorer,
    RowScores,
    ScoreStats,
    TokenizerMismatchError,
    check_same_tokenizer,
    tokenizer_fingerprint,
)

__all__ = [
    "LocalHFTeacher",
    "LocalScorer",
    "OpenAITeacher",
    "RemoteScorer",
    "RowScores",
    "ScoreStats",
    "Teacher",
    "TeacherError",
    "TeacherResponse",
    "TokenizerMismatchError",
    "build_teacher",
    "check_same_tokenizer",
    "tokenizer_fingerprint",
]
