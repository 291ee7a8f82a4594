"""Secret redaction applied to every string before a TraceState exists.

Two layers:

1. Our own typed patterns (``PATTERNS``) for what the detector library lacks or under-matches:
   current OpenAI / Anthropic / OpenRouter / Hugging Face / Google API keys, AWS secret keys next
   to an ``aws`` name, whole PEM private-key blocks, full three-part JWTs, passwords in URLs,
   ``.env``-style ``NAME=value`` lines whose name looks secret, and quoted ``"api_key": "..."``
   assignments.
2. Yelp's detect-secrets plugins (https://github.com/Yelp/detect-secrets) via their
   ``analyze_string`` (regex denylists only; no network verification) for AWS access keys,
   GitHub, GitLab, Slack, OpenAI legacy, Stripe, SendGrid, PyPI and basic-auth URLs. Whatever
   they find that layer 1 left is replaced too.

Each detector has cheap literal triggers; its regex only runs on strings containing a trigger.
Whether a string may contain *any* trigger is decided first by one compiled regex built from the
same trigger lists, so ordinary text costs one C-level scan instead of ~60 substring scans (see
`_any_trigger_regex`).
Before any of that, JSONL readers can ask `Redactor.raw_scanner` which raw lines may contain a
trigger at all: one Hyperscan pass over a block of raw lines (``hyperscan``, Intel's
multi-pattern matcher) marks them; strings decoded from unmarked lines skip redaction.
Replacements are typed placeholders: ``<REDACTED:aws_access_key>``.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

PLACEHOLDER = "<REDACTED:{}>"

_ENV_NAME = (
    r"[A-Z0-9_]*(?:SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|"
    r"CREDENTIALS?|AUTH_?KEY|CLIENT_?SECRET)[A-Z0-9_]*"
)
_VALUE_CHARS = r"[A-Za-z0-9_\-./+=:@!$%^&*~,]"


_SECRET_NAME = (
    r"(?:secret|passw(?:or)?d|pwd|token(?!s|iz)|api[_\-]?key|private[_\-]?key|"
    r"access[_\-]?key|auth[_\-]?key|[_\-.]key|credential)[A-Za-z0-9_\-]*"
)
"""The part of a name that says secret, password, token, key or credential (``DB_PASSWORD``,
``apiKey``, ``client.secret``, ``ssh-key``, ``AWS_CREDENTIALS``); a bare ``key`` is too common
in code, and ``tokens``/``tokenizer`` are counts and tools, not secrets."""
_ASSIGNED = _SECRET_NAME + r"[\"'`]?[ \t]*(?:=>|:=|=|:)[ \t]*"
"""A secret name assigned: ``NAME=``, ``NAME = ``, ``NAME: ``, ``"name": ``, ``name :=``, in any
container (a shell command, a heredoc, YAML, JSON, code), starting at the keyword (linear)."""
_BARE_VALUE = (
    r"((?=[^\s\"'`]*[0-9])(?=[^\s\"'`]*[A-Za-z])" + _VALUE_CHARS + r"{8,})(?![A-Za-z0-9_.]*\()"
)
"""An unquoted value that looks like a secret: 8 or more value characters with a letter and a
digit, not a call (``token = get_token2(x)``)."""
_NAME_TRIGGERS = ("secret", "passw", "pwd", "token", "key", "credential")
_ASSIGNMENT_NAMES = ("api_key", "api-key", "apikey", "secret_key", "secret-key", "secretkey",
                     "client_secret", "client-secret", "clientsecret", "password", "passwd",
                     "access_token", "access-token", "accesstoken", "auth_token", "auth-token",
                     "authtoken")  # fmt: skip
_NAME_STARTS = {"secret": (0,), "passw": (0,), "pwd": (0,), "token": (0,), "credential": (0,),
                "key": (1, 3, 4, 5, 6, 7, 8)}  # fmt: skip
"""How far before its trigger a :data:`_SECRET_NAME` match may start: at the trigger, except
for ``key`` (``_key``; ``apikey``, ``api_key``, ``authkey``... ``private_key``)."""


@dataclass(frozen=True)
class Pattern:
    """A typed secret regex. ``group`` is the capture group to replace (0 = whole match);
    ``triggers`` are substrings one of which must occur (``lower`` = checked on lowercased text)."""

    kind: str
    regex: re.Pattern[str]
    triggers: tuple[str, ...]
    group: int = 0
    lower: bool = False
    starts: dict[str, tuple[int, ...]] | None = None
    """Trigger -> how many characters before an occurrence of it a match may start: the
    regex is then tried only there (``None``: a scan of the whole text). A case-insensitive
    alternation without a literal prefix costs Python's ``re`` ~200 ns a character, at every
    position: over 90% of ingestion's time before (docs/benchmarks.md)."""


def _p(
    kind: str,
    rx: str,
    triggers: tuple[str, ...],
    group: int = 0,
    flags: int = 0,
    lower: bool = False,
    starts: dict[str, tuple[int, ...]] | None = None,
) -> Pattern:
    if starts is not None and set(starts) != set(triggers):
        raise ValueError(f"pattern {kind}: start offsets for {sorted(starts)}, triggers {triggers}")
    return Pattern(kind, re.compile(rx, flags), triggers, group, lower, starts)


# Order matters: specific provider keys before the generic OpenAI ``sk-`` shape.
PATTERNS: tuple[Pattern, ...] = (
    _p(
        "private_key",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        ("PRIVATE KEY",),
    ),
    _p("anthropic_api_key", r"sk-ant-[A-Za-z0-9]{2,8}\d{0,2}-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    _p("openrouter_api_key", r"sk-or-v1-[0-9a-fA-F]{32,}", ("sk-or-",)),
    _p(
        "openai_api_key",
        r"(?<![A-Za-z0-9_\-])sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}",
        ("sk-",),
    ),
    _p("huggingface_token", r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}", ("hf_",)),
    _p("google_api_key", r"AIza[0-9A-Za-z_\-]{35}", ("AIza",)),
    _p(
        "aws_access_key",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])",
        ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
    ),
    _p(
        "aws_secret_key",
        r"aws.{0,24}?(?:secret|key|token).{0,24}?[=:]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        ("aws",),
        group=1,
        flags=re.IGNORECASE,
        lower=True,
    ),
    _p(
        "github_token",
        r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _p("github_token", r"github_pat_[A-Za-z0-9_]{40,}", ("github_pat_",)),
    _p(
        "gitlab_token",
        r"(?:glpat|gldt|glft|glsoat|glrt|glcbt|glptt|gloas|glimt|glagent)-[A-Za-z0-9_\-]{20,}",
        (
            "glpat-",
            "gldt-",
            "glft-",
            "glsoat-",
            "glrt-",
            "glcbt-",
            "glptt-",
            "gloas-",
            "glimt-",
            "glagent-",
        ),
    ),
    _p("slack_token", r"xox[abposre]-[A-Za-z0-9\-]{10,}", ("xox",)),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9_/]+",
        ("hooks.slack.com",),
    ),
    _p(
        "jwt",
        r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        ("eyJ",),
    ),
    _p(
        "url_password",
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@\"'<>]+:([^\s@/\"'<>]+)@",
        ("://",),
        group=1,
    ),
    _p(
        "env_secret",
        # line start, after a literal "\n" (JSON-escaped text), or after a shell separator
        r"(?m)(?:^|(?<=\\n)|(?<=[\s;&(]))(?:export[ \t]+)?"
        + _ENV_NAME
        + r"[ \t]*=[ \t]*[\"']?("
        + _VALUE_CHARS
        + r"{6,})",
        ("SECRET", "TOKEN", "PASSW", "KEY", "CREDENTIAL"),
        group=1,
    ),
    _p(
        "secret_assignment",
        # starts at the keyword (no leading [\w]* scan): linear, fast on ordinary prose
        r"(?:api[_\-]?key|secret[_\-]?key|client[_\-]?secret|password|passwd|"
        r"access[_\-]?token|auth[_\-]?token)[\"']?\s*[:=]\s*[\"'](" + _VALUE_CHARS + r"{8,})[\"']",
        _ASSIGNMENT_NAMES,
        group=1,
        flags=re.IGNORECASE,
        lower=True,
        starts={t: (0,) for t in _ASSIGNMENT_NAMES},  # each a whole name, the match's start
    ),
    _p(
        "secret_assignment",
        _ASSIGNED + r"([\"'`])((?:(?!\1)[^\n\\]){6,}?)\1",
        _NAME_TRIGGERS,
        group=2,
        flags=re.IGNORECASE,
        lower=True,
        starts=_NAME_STARTS,
    ),  # fmt: skip
    _p(
        "secret_assignment",
        _ASSIGNED + _BARE_VALUE,
        _NAME_TRIGGERS,
        group=1,
        flags=re.IGNORECASE,
        lower=True,
        starts=_NAME_STARTS,
    ),  # fmt: skip
)

# detect-secrets plugin class name -> (our kind, triggers)
_DETECT_SECRETS_PLUGINS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "AWSKeyDetector": ("aws", "aws_access_key", ("AKIA", "ASIA", "ABIA", "ACCA", "A3T")),
    "GitHubTokenDetector": (
        "github_token",
        "github_token",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    "GitLabTokenDetector": ("gitlab_token", "gitlab_token", ("gl", "GR1348941")),
    "SlackDetector": ("slack", "slack_token", ("xox", "hooks.slack.com")),
    "OpenAIDetector": ("openai", "openai_api_key", ("T3BlbkFJ",)),
    "StripeDetector": ("stripe", "stripe_key", ("k_live_",)),
    "SendGridDetector": ("sendgrid", "sendgrid_key", ("SG.",)),
    "PypiTokenDetector": ("pypi_token", "pypi_token", ("pypi-",)),
    "BasicAuthDetector": ("basic_auth", "url_password", ("://",)),
}


# Characters from most to least frequent in agent logs (byte counts over ../shared/fixtures).
# Only used to pick where a trigger is anchored in the any-trigger regex: it affects speed, never
# which strings match. Characters not listed count as rarest.
_CHAR_FREQUENCY_ORDER = (
    " etn\"irosald\\mu:cpfh,_.yg-01\n/wbxv)(4=k523T'6IER9S87NDOLACPFqUMjWHBVYzGZXQ@KJ"
)


# Non-ASCII characters whose lowercase (``str.lower``) contains an ASCII letter, and that letter.
# tests/unit/traces/test_fast_paths.py checks this table against every Unicode code point.
_LOWERS_TO_ASCII = {"\u0130": "i", "\u212a": "k"}  # LATIN CAPITAL I WITH DOT, KELVIN SIGN
# Non-ASCII characters ``re.IGNORECASE`` matches as an ASCII letter though ``str.lower`` keeps
# them (``paſſword`` matches ``password``): `_fold` maps them, so a trigger is found where the
# case-insensitive patterns match; also checked against every code point.
_MATCHES_ASCII = {"\u0131": "i", "\u017f": "s"}  # LATIN SMALL DOTLESS I, LATIN SMALL LONG S
_FOLD_TABLE = str.maketrans(_MATCHES_ASCII)
_RARE = {**_LOWERS_TO_ASCII, **_MATCHES_ASCII}
"""Characters the one-regex trigger scan and the raw needles leave to the exact scan."""


def _fold(text: str) -> str:
    """``text.lower()`` with `_MATCHES_ASCII` mapped: the haystack of the lowercase triggers
    (same length as ``text.lower()``)."""
    low = text.lower()
    return low if low.isascii() else low.translate(_FOLD_TABLE)


def _minimal(needles: set[str]) -> list[str]:
    """Needles not containing another needle: if any needle occurs, one of these occurs."""
    return sorted(n for n in needles if not any(m != n and m in n for m in needles))


def _any_trigger_regex(case: set[str], lower: set[str]) -> re.Pattern[str] | None:
    """One regex that matches ``text`` whenever a ``case`` needle occurs in ``text`` or a ``lower``
    needle in ``text.lower()``, provided ``text`` has no character of ``_RARE``
    (``None`` for no needles).

    Exact for case needles. A lowercase needle is matched on the text itself with each letter
    as ``[xX]``: each character of a needle occurrence in ``text.lower()`` comes from one
    character of ``text`` that is the needle character or its uppercase, apart from the
    characters of ``_RARE``, which `Redactor.any_trigger` checks separately.

    Speed: Python's regex engine skips in C over characters that cannot start a match only when
    every alternative starts with a literal; at every other position it runs a full match
    attempt, and plain alternations start with common letters (``sk-``, ``gl``, ``eyJ``). So each
    needle ``head + rest``, where ``head`` ends at the needle's rarest character ``c``, is written
    ``c(?<=head)rest`` (the lookbehind re-checks ``head`` including ``c``), once for each case of
    ``c`` for lowercase needles, and needles sharing ``c`` are grouped as ``c(?:...|...)``.
    """
    order = _CHAR_FREQUENCY_ORDER
    by_anchor: dict[str, list[str]] = {}  # one group per anchor: fewer branches tried per stop
    for n, fold in [(n, False) for n in _minimal(case)] + [(n, True) for n in _minimal(lower)]:

        def cases(ch: str, fold: bool = fold) -> list[str]:
            return [ch, ch.upper()] if fold and ch.upper() != ch else [ch]

        def one(ch: str) -> str:
            alts = cases(ch)
            return re.escape(ch) if len(alts) == 1 else "[" + "".join(alts) + "]"

        # rarest character: latest in the frequency order, unlisted ones first; ties -> leftmost
        i = max(range(len(n)), key=lambda k: (order.find(n[k]) % (len(order) + 1), -k))
        behind = f"(?<={''.join(map(one, n[: i + 1]))})" if i else ""
        rest = "".join(map(one, n[i + 1 :]))
        for c in cases(n[i]):
            by_anchor.setdefault(c, []).append(behind + rest)
    # most frequent anchors first: at each stop the engine tries the groups in order
    groups = sorted(by_anchor.items(), key=lambda kv: order.find(kv[0]) % (len(order) + 1))
    parts = [re.escape(c) + "(?:" + "|".join(tails) + ")" for c, tails in groups]
    return re.compile("|".join(parts)) if parts else None


def _load_library_detectors() -> list[tuple[str, tuple[str, ...], Callable]]:
    """(kind, triggers, analyze_string) for each detect-secrets plugin we use; [] if absent."""
    try:
        import importlib

        out = []
        for cls_name, (module, kind, triggers) in _DETECT_SECRETS_PLUGINS.items():
            mod = importlib.import_module(f"detect_secrets.plugins.{module}")
            out.append((kind, triggers, getattr(mod, cls_name)().analyze_string))
        return out
    except ImportError:  # pragma: no cover - detect-secrets is a core dependency
        return []


class Redactor:
    """Replaces secrets in strings by typed placeholders and counts them by type.

    ``redact(text)`` is pure in its output; ``counts`` accumulates over calls.
    """

    def __init__(self, use_library: bool = True) -> None:
        self.counts: Counter[str] = Counter()
        self._library = _load_library_detectors() if use_library else []
        self.uses_library = bool(self._library)
        self._index_triggers()

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by a typed placeholder, also secrets written
        inside JSON string escapes in it (tool arguments holding a JSON-encoded command, a
        JSON string inside a JSON string, ``\\u``-escaped characters), up to
        ``MAX_ESCAPE_DEPTH`` layers deep (:meth:`_redact_escaped`)."""
        return self._redact_layers(text, MAX_ESCAPE_DEPTH)

    def _redact_layers(self, text: str, depth: int) -> str:
        """The plain pass, then (while ``depth`` > 0) the pass over decoded JSON escapes."""
        out = self._redact_plain(text)
        if depth > 0 and "\\" in out and not self.json_text_is_clean(out):  # else no escape
            out = self._redact_escaped(out, depth)  # can hide a secret
        return out

    def redact_obj(self, obj: object) -> object:
        """``obj`` (JSON-like: dicts, lists, strings) with every string redacted; a new object
        only where something changed."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, list):
            out = [self.redact_obj(x) for x in obj]
            return obj if all(a is b for a, b in zip(out, obj, strict=True)) else out
        if isinstance(obj, dict):
            new = {k: self.redact_obj(v) for k, v in obj.items()}
            return obj if all(new[k] is v for k, v in obj.items()) else new
        return obj

    def _redact_escaped(self, text: str, depth: int) -> str:
        """Decode one layer of JSON escapes (RFC 8259 sec. 7) wherever they occur in ``text``,
        redact the decoded view (recursively, for deeper layers), and put each placeholder back
        over the escaped span of ``text`` that decodes to the secret it replaced. Everything
        else of ``text`` stays byte for byte."""
        view, starts = _unescape_with_offsets(text)
        if view == text:
            return text
        red = self._redact_layers(view, depth - 1)
        if red == view:
            return text
        spans = _replaced_spans(view, red)
        if spans is None:  # cannot align: keep the decoded, redacted view (never the secret)
            return red
        out, pos = [], 0
        for (a, b), placeholder in spans:
            out += [text[pos : starts[a]], placeholder]
            pos = starts[b]
        out.append(text[pos:])
        return "".join(out)

    def _redact_plain(self, text: str) -> str:
        if len(text) < 8 or not self.any_trigger(text):
            return text
        low = _fold(text) if self._lower_triggers else text
        todo = self._triggered(text, low)
        if not todo:
            return text
        for i in sorted(todo):
            if i < len(PATTERNS):
                new = self._sub(PATTERNS[i], text, low)
                if new is not text:
                    text, low = new, _fold(new)
            else:
                kind, _triggers, analyze = self._library[i - len(PATTERNS)]
                text = self._replace_found(kind, text, analyze)
        return text

    def any_trigger(self, text: str) -> bool:
        """True whenever ``self._triggered(text)`` is non-empty (one regex scan instead of one
        substring scan per trigger; see `_any_trigger_regex`). Equal to it on ASCII text."""
        if self._any is None:
            return False
        if not text.isascii() and any(c in text for c in _RARE):
            return True  # rare: let the exact scan decide
        return self._any.search(text) is not None

    def json_text_is_clean(self, text: str) -> bool:
        """True if `redact` would leave ``text`` and every string decoded from it as JSON
        unchanged (a subclass that changes `redact` must change this too).

        Triggers contain no quote, backslash or control character, so a JSON escape can hide a
        trigger character only as ``\\uXXXX`` or ``\\/``; without those, every trigger occurrence
        in a decoded string is also a verbatim substring of ``text``.
        """
        return "\\u" not in text and "\\/" not in text and not self.any_trigger(text)

    def _triggered(self, text: str, low: str | None = None) -> set[int]:
        """Indexes of detectors (patterns, then library plugins) whose trigger occurs
        (``low``: ``_fold(text)`` when the caller has it)."""
        todo: set[int] = set()
        for trigger, idx in self._case_triggers:
            if trigger in text:
                todo.update(idx)
        if self._lower_triggers:
            low = _fold(text) if low is None else low
            for trigger, idx in self._lower_triggers:
                if trigger in low:
                    todo.update(idx)
        return todo

    def _index_triggers(self) -> None:
        case: dict[str, list[int]] = {}
        lower: dict[str, list[int]] = {}
        for i, pat in enumerate(PATTERNS):
            for t in pat.triggers:
                (lower if pat.lower else case).setdefault(t, []).append(i)
        for j, (_kind, triggers, _fn) in enumerate(self._library):
            for t in triggers:
                case.setdefault(t, []).append(len(PATTERNS) + j)
        self._case_triggers = tuple((t, tuple(v)) for t, v in case.items())
        self._lower_triggers = tuple((t, tuple(v)) for t, v in lower.items())
        self._any, self._raw_needles = _trigger_scanners(frozenset(case), frozenset(lower))

    def raw_scanner(self) -> RawLineScanner | None:
        """A scanner of raw JSONL lines: `redact` leaves every string decoded from a line it does
        not mark unchanged. ``None`` without the ``hyperscan`` package, or for a subclass that
        overrides `redact` (it must then decide for itself: override this method too)."""
        if type(self).redact is not Redactor.redact:
            return None
        db = _hyperscan_database(*self._raw_needles)
        return None if db is None else RawLineScanner(db)

    def _sub(self, pat: Pattern, text: str, low: str | None = None) -> str:
        """``text`` with ``pat``'s matches replaced (``low``: ``_fold(text)``, if known)."""
        placeholder = PLACEHOLDER.format(pat.kind)
        hits = 0

        def repl(m: re.Match[str]) -> str:
            nonlocal hits
            if pat.group == 0:
                hits += 1
                return placeholder
            val = m.group(pat.group)
            if val.startswith("<REDACTED:"):
                return m.group(0)
            hits += 1
            start, end = m.span(pat.group)
            base = m.start(0)
            whole = m.group(0)
            return whole[: start - base] + placeholder + whole[end - base :]

        starts = _trigger_starts(pat, text, low)
        new = pat.regex.sub(repl, text) if starts is None else _sub_at(pat, text, starts, repl)
        if not hits:
            return text
        self.counts[pat.kind] += hits
        return new

    def _replace_found(self, kind: str, text: str, analyze: Callable) -> str:
        try:
            found = {s for s in analyze(text) if isinstance(s, str) and len(s) >= 8}
        except Exception:  # a library bug must not crash ingestion; our patterns still ran
            return text
        for secret in sorted(found, key=len, reverse=True):
            if "<REDACTED:" in secret or secret not in text:
                continue
            self.counts[kind] += text.count(secret)
            text = text.replace(secret, PLACEHOLDER.format(kind))
        return text


def _trigger_starts(pat: Pattern, text: str, low: str | None = None) -> list[int] | None:
    """Where a match of ``pat`` may start (ascending), from each occurrence of a trigger and
    ``pat.starts``; None when the whole text must be scanned (no offsets, or lowercasing
    changed the length, so positions would not align)."""
    if pat.starts is None:
        return None
    hay = (_fold(text) if low is None else low) if pat.lower else text
    if len(hay) != len(text):
        return None
    starts: set[int] = set()
    for trigger, offsets in pat.starts.items():
        i = hay.find(trigger)
        while i >= 0:
            starts.update(i - k for k in offsets if k <= i)
            i = hay.find(trigger, i + 1)
    return sorted(starts)


def _sub_at(
    pat: Pattern, text: str, starts: list[int], repl: Callable[[re.Match[str]], str]
) -> str:
    """``pat.regex.sub(repl, text)`` when every match starts at one of ``starts``: the
    leftmost match first, the next one after its end, as ``re.sub`` scans."""
    out: list[str] = []
    pos = 0
    for s in starts:
        if s < pos:
            continue
        m = pat.regex.match(text, s)
        if m is None or m.end() == m.start():
            continue
        out += [text[pos : m.start()], repl(m)]
        pos = m.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


MAX_ESCAPE_DEPTH = 4
"""Layers of JSON escaping (a JSON string in a JSON string in ...) that redaction looks into."""

_JSON_ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|(["\\/bfnrt]))')
# JSON's two-character escapes (RFC 8259 section 7) and the character each one decodes to.
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_SHORT_DECODE = {esc[1]: char for char, esc in _SHORT_ESCAPES.items()}
"""The inverse: the character after the backslash -> the character it stands for."""
_PLACEHOLDER_RX = re.compile(r"<REDACTED:[a-z0-9_]+>")


def _unescape_with_offsets(text: str) -> tuple[str, list[int]]:
    """``text`` with its JSON escapes decoded, and for each decoded character (plus one past
    the end) the offset in ``text`` where it starts; text outside escapes is kept as is."""
    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for m in _JSON_ESCAPE.finditer(text):
        parts.append(text[pos : m.start()])
        starts.extend(range(pos, m.start()))
        parts.append(chr(int(m.group(1), 16)) if m.group(1) else _SHORT_DECODE[m.group(2)])
        starts.append(m.start())
        pos = m.end()
    parts.append(text[pos:])
    starts.extend(range(pos, len(text) + 1))
    return "".join(parts), starts


def _replaced_spans(view: str, red: str) -> list[tuple[tuple[int, int], str]] | None:
    """The spans of ``view`` that redaction replaced to give ``red``, with their placeholders
    (``red`` is ``view`` with some substrings replaced by placeholders). None if the two do not
    align (then the caller falls back to the redacted view)."""
    pieces = _PLACEHOLDER_RX.split(red)
    holders = _PLACEHOLDER_RX.findall(red)
    rx = "".join(re.escape(p) + ("(.+?)" if i < len(holders) else "") for i, p in enumerate(pieces))
    m = re.fullmatch(rx, view, flags=re.DOTALL)
    if m is None:
        return None
    return [(m.span(i + 1), h) for i, h in enumerate(holders) if view[slice(*m.span(i + 1))] != h]


@lru_cache(maxsize=8)
def _trigger_scanners(
    case: frozenset[str], lower: frozenset[str]
) -> tuple[re.Pattern[str] | None, tuple[tuple[bytes, ...], tuple[bytes, ...]]]:
    """The any-trigger regex and the raw needles (cached: a redactor is made per ingest run)."""
    exact, folded = raw_needles(set(case), set(lower))
    return _any_trigger_regex(set(case), set(lower)), (tuple(exact), tuple(folded))


def raw_needles(case: set[str], lower: set[str]) -> tuple[list[bytes], list[bytes]]:
    """(case-sensitive, ASCII-case-insensitive) byte needles such that a raw JSON line with none
    of them decodes only to strings ``s`` in which no ``case`` needle occurs and no ``lower``
    needle occurs in ``s.lower()``.

    - the needles themselves, as UTF-8 (a verbatim occurrence);
    - for every character a needle uses (both cases for ``lower`` needles) and every character
      of ``_RARE``: its ``\\uXXXX`` escape (hex digits in either case) and, where
      JSON has one, its two-character escape: the only ways a JSON string can spell a character
      other than verbatim;
    - the characters of ``_RARE`` as UTF-8 (their lowercase contains ASCII letters, or the
      patterns match them as one).
    Triggers are ASCII (checked), so their bytes never fall inside a multi-byte character.
    """
    if not all(n.isascii() for n in case | lower):
        raise ValueError("raw_needles: redaction triggers must be ASCII")
    exact = [n.encode() for n in _minimal(case)]
    folded = [n.encode() for n in _minimal(lower)]
    chars = set("".join(case)) | {c for n in lower for c in (n + n.upper())}
    chars |= set(_RARE)
    for c in sorted(chars):
        folded.append(b"\\u%04x" % ord(c))
        if c in _SHORT_ESCAPES:
            exact.append(_SHORT_ESCAPES[c].encode())
        if not c.isascii():
            exact.append(c.encode())
    return exact, folded


class RawLineScanner:
    """Marks the raw JSONL lines that may hold a redaction trigger (see `raw_needles`).

    One Hyperscan block scan per block of lines; no needle contains a newline, so each match lies
    inside one line. Hyperscan scratch space is per thread.
    """

    def __init__(self, database: object) -> None:
        self._db = database
        self._scratch = _scratch(database)

    def match_ends(self, block: bytes) -> list[int]:
        """Sorted end offsets (exclusive) of the needle occurrences in ``block``."""
        ends: list[int] = []

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            ends.append(end)

        self._db.scan(block, match_event_handler=on_match, scratch=self._scratch)
        ends.sort()
        return ends


_THREAD = threading.local()


def _scratch(database: object) -> object:
    """This thread's Hyperscan scratch space for ``database`` (allocating one costs ~0.3 ms)."""
    import hyperscan

    cache = _THREAD.__dict__.setdefault("scratch", {})  # id -> (database kept alive, scratch)
    entry = cache.get(id(database))
    if entry is None or entry[0] is not database:
        entry = cache[id(database)] = (database, hyperscan.Scratch(database))
    return entry[1]


@lru_cache(maxsize=8)
def _hyperscan_database(exact: tuple[bytes, ...], folded: tuple[bytes, ...]) -> object | None:
    """Compiled block-mode database of literal needles (cached: redactors are made per run)."""
    try:
        import hyperscan
    except ImportError:  # optional accelerator; readers fall back to per-string checks
        return None
    pats = [b"".join(b"\\x%02x" % b for b in n) for n in exact + folded]
    flags = [0] * len(exact) + [hyperscan.HS_FLAG_CASELESS] * len(folded)
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=pats, ids=list(range(len(pats))), elements=len(pats), flags=flags)
    return db
