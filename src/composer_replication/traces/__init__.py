"""Agent logs -> redacted per-step `TraceState`s (see docs/ingestion.md)."""

from .detect import FORMATS, UnknownFormatError, detect_format
from .ingest import IngestRun, ingest
from .redact import Redactor
from .report import FileReport, IngestReport
from .schema import SCHEMA_VERSION, Action, StateMeta, TraceState

__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "Action",
    "FileReport",
    "IngestReport",
    "IngestRun",
    "Redactor",
    "StateMeta",
    "TraceState",
    "UnknownFormatError",
    "detect_format",
    "ingest",
]
