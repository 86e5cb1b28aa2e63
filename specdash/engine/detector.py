"""What kind of text is being generated: code, JSON or prose.

Acceptance rates differ a lot by content (a draft copies code identifiers and JSON keys
far better than it guesses prose), so the adaptive-K controller keeps one acceptance
estimate per label. Everything here is cheap, regex-and-count features on at most a
few hundred characters; no model.

Labels: "code" (programming languages, and config/query languages such as YAML, SQL,
shell), "json" (JSON / JSON lines, including a window cut mid-document), "prose"
(natural language, including Markdown with headings and lists).
"""

from __future__ import annotations

import json
import re
from typing import Protocol

CONTENT_TYPES = ("code", "json", "prose")

# A double-quoted string on one line (JSON strings never span lines), and the head of
# one a window cut off at the end of a line.
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_UNTERMINATED = re.compile(r'"(?:[^"\\\n]|\\.)*\\?$')
_JSON_WORDS = re.compile(r"\b(?:true|false|null)\b")
_JSON_CHARS = frozenset("{}[],:0123456789.-+eE")

# Each hit is strong evidence of code; English rarely produces these shapes.
_CODE_PATTERNS = re.compile(
    r"""
      ^\s*(?:def|class|import|from|fn|func|pub|impl|package|using|interface|struct|enum)\s+[\w.{]
    | ^\s*\#\s*(?:include|define|if|ifdef|endif|pragma)\b
    | \b(?:function|const|let|var|return|elif|async|await|lambda|typeof|nullptr|void|static)\b
    | \b(?:self|this)\.\w
    | ^\s*(?:if|for|while|switch|catch|except|try|else|elif|with)\b[^\n]*[:{]\s*$
    | =>|->|::|==|!=|<=|>=|&&|\|\||\+=|-=|\+\+|\*\*
    | \w\.\w+\(
    | [\w\]\)]\s*=\s*[\w\[{("'-]
    | ;\s*$
    | [{(\[]\s*$
    | ^\s*[}\])]+[;,)]*\s*$
    | \b[a-z]+_[a-z_]+\b
    | \b[a-z]+[A-Z]\w*\(
    | \b(?:SELECT|FROM|WHERE|JOIN|GROUP\ BY|ORDER\ BY|INSERT\ INTO|VALUES|CREATE\ TABLE)\b
    | ^\s*(?:-\s+)?[\w.-]+:(?:\s+[^\s\#]+)?\s*$
    """,
    re.VERBOSE | re.MULTILINE,
)
# Neither code nor prose: URLs, setext underlines and rules ("=====", "-----").
_NEUTRAL = re.compile(r"https?://\S+|([=\-*_~#+])\1{2,}")
# Comments exist only in code, so a comment line is evidence of code and its words are
# not evidence of prose. An unindented "# " is left out: it may be a Markdown heading.
_COMMENT_LINE = re.compile(r"^(?:\s+#|\s*//|\s*/\*|\s*\*/|\s*--\s)")
# A comment after code on the same line ("x = 1  # why", "int n; /* why */").
_INLINE_COMMENT = re.compile(r"(?<=\S)\s*(?:/\*.*?(?:\*/|$)|(?<![:/])//.*$|\s#\s.*$)")
_SENTENCE_END = re.compile(r"[a-z)][.!?](?:\s|$)")
# Headings only unindented and not a C preprocessor line; indented "# ..." is a comment.
_MARKDOWN_LINE = re.compile(
    r"^(?:#{1,6}\s+(?!(?:include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma)\b)"
    r"|\s*[-*+]\s+\S|\s*\d+[.)]\s+\S|\s*>\s)"
)
# Function words that English needs and code hardly uses (so not "in", "is", "for",
# "if", "not", "and", "or", "with", "as", "this", "new", "from": keywords somewhere).
_STOPWORDS = frozenset(
    "the a an of to that was were are be been it its you your we our they their he she his "
    "her which who have has had on at by but so can will would should could there than then "
    "when what about more most some also very just only into because after before".split()
)
# Words standing alone: not part of an identifier (snake_case, a.b) nor a call.
_WORDS = re.compile(r"(?<![\w.])[A-Za-z']+(?![\w(])")


def _json_purity(lines: list[str]) -> tuple[float, int]:
    """(share of the non-string, non-space characters that JSON allows, strings).

    JSON strings never span lines, so each line is read on its own. A window cut inside
    a string leaves a line with an odd number of quotes: either its start is the tail of
    a string (read it with a quote prepended) or its end is the head of one (drop the
    unterminated rest); the reading with fewer non-JSON characters is kept."""
    allowed = total = strings = 0
    for line in lines:
        variants = [line]
        if (line.count('"') - line.count('\\"')) % 2:
            variants.append('"' + line)
        best: tuple[int, int] | None = None
        for variant in variants:
            rest = _JSON_WORDS.sub("", _UNTERMINATED.sub("", _STRING.sub("", variant)))
            chars = [c for c in rest if not c.isspace()]
            ok = sum(c in _JSON_CHARS for c in chars)
            if best is None or len(chars) - ok < best[1] - best[0]:
                best = (ok, len(chars))
        assert best is not None
        allowed += best[0]
        total += best[1]
        strings += line.count('"') // 2
    return (allowed / total if total else 0.0), strings


def _comment_lines(lines: list[str]) -> list[bool]:
    """Which lines are comments: line comments and /* ... */ blocks, including a block
    the window starts inside (its first marker is a "*/")."""
    flags = [bool(_COMMENT_LINE.match(ln)) for ln in lines]
    in_block: bool | None = None  # unknown until the first marker
    for i, ln in enumerate(lines):
        ln = _STRING.sub("", ln)  # "**/*.js" in a string is no comment
        first_open, first_close = ln.find("/*"), ln.find("*/")
        if in_block:
            flags[i] = True
        elif in_block is None and first_close >= 0 and not 0 <= first_open < first_close:
            flags[: i + 1] = [True] * (i + 1)
        last_open, last_close = ln.rfind("/*"), ln.rfind("*/")
        if last_open > last_close:
            in_block = True
        elif last_close >= 0:
            in_block = False
    return flags


def detect_content(text: str) -> str:
    """Classify `text` as "code", "json" or "prose" (the default for empty text)."""
    stripped = text.strip()
    if not stripped:
        return "prose"
    if stripped[0] in "[{":
        try:
            json.loads(stripped)
            return "json"
        except ValueError:
            pass
    lines = [ln for ln in stripped.splitlines() if ln.strip()]
    # Mostly strings, numbers and punctuation JSON allows; without any bracket in view
    # (a window inside a long object) the strings must carry it.
    purity, n_strings = _json_purity(lines)
    if purity >= 0.9 and (n_strings >= 2 or any(c in stripped for c in "{}[]")):
        return "json"

    comment = _comment_lines(lines)
    text_lines = []
    comments = sum(comment)
    for ln, is_comment in zip(lines, comment):
        if not is_comment:
            code_part, n_inline = _INLINE_COMMENT.subn("", ln)
            comments += n_inline
            text_lines.append(code_part)
    text = _NEUTRAL.sub(" ", "\n".join(text_lines))
    words = _WORDS.findall(_STRING.sub(" ", text))  # a string literal's words are data
    stop_share = sum(w.lower() in _STOPWORDS for w in words) / len(words) if words else 0.0
    code_hits = (len(_CODE_PATTERNS.findall(text)) + comments) / len(lines)
    markdown = sum(bool(_MARKDOWN_LINE.match(ln)) for ln in text_lines) / len(lines)
    sentences = len(_SENTENCE_END.findall(text)) / len(lines)
    symbols = sum(c in "(){}[];=<>&|+*/%!" for c in text) / max(len(text), 1)

    code_score = code_hits + 12 * symbols
    prose_score = 8 * stop_share * len(text_lines) / len(lines) + sentences + 0.5 * markdown
    return "code" if code_score > prose_score else "prose"


# Words in a request that say what the answer will be, before any of it is generated.
_CODE_INTENT = re.compile(
    r"\b(?:code|function|class|method|script|program|implement\w*|refactor\w*|debug\w*|"
    r"compile\w*|regex|sql|query|python|javascript|typescript|java|rust|golang|c\+\+|c#|"
    r"bash|shell|yaml|dockerfile|html|css|unit tests?)\b|\b(?:in|using) (?:c|go)\b",
    re.IGNORECASE,
)
_JSON_INTENT = re.compile(r"\bjson\b", re.IGNORECASE)


def prompt_prior(prompt: str) -> str:
    """The label to assume before the output says anything: what the prompt asks for
    (JSON, code) or, failing that, what the prompt itself looks like."""
    if _JSON_INTENT.search(prompt):
        return "json"
    if _CODE_INTENT.search(prompt):
        return "code"
    return detect_content(prompt[-800:])


class Detector(Protocol):
    """What the engine asks of a content detector."""

    label: str  # the current class: "code", "json", "prose", ...

    def reset(self, prompt: str = "") -> None: ...

    def update(self, piece: str) -> str: ...


class ContentDetector:
    """Labels the text being generated from a rolling window of its last `window`
    characters, re-classified every `every` characters (not every call: update() runs
    once per decode step). Until `min_chars` characters have been generated the prompt's
    prior holds. Markdown code fences are tracked exactly, even when a fence is split
    across pieces: inside ```json the label is "json", inside a fence naming any other
    language "code"; an unnamed or text/markdown fence is classified like the rest. A
    fence starts a fresh window so the text before it does not blur the label after it,
    and closing one restores the label that held before it opened.
    """

    def __init__(self, window: int = 600, every: int = 48, min_chars: int = 48):
        if window < 16 or every < 1 or min_chars < 0:
            raise ValueError("ContentDetector needs window >= 16, every >= 1, min_chars >= 0")
        self.window = window
        self.every = every
        self.min_chars = min_chars
        self.reset()

    def reset(self, prompt: str = "") -> None:
        """A new prompt: the prior comes from it; the window starts empty."""
        self.prior = prompt_prior(prompt) if prompt.strip() else "prose"
        self.label = self.prior
        self._buf = ""
        self._since = 0
        self._in_fence = False
        self._info: str | None = None  # a fence's info string while it is being read
        self._fence_label: str | None = None  # label fixed by the fence's language
        self._outer_label = self.label
        self._carry = ""  # trailing backticks that may be the start of a fence

    def update(self, piece: str) -> str:
        """Add generated text; return the current label."""
        text = self._carry + piece
        start = 0
        while (at := text.find("```", start)) >= 0:
            self._append(text[start:at])
            self._toggle_fence()
            start = at + 3
        tail = text[start:]
        keep = min(2, len(tail) - len(tail.rstrip("`")))
        self._carry = tail[len(tail) - keep :]
        self._append(tail[: len(tail) - keep])
        return self.label

    def _toggle_fence(self) -> None:
        self._in_fence = not self._in_fence
        self._buf = ""
        self._since = 0
        if self._in_fence:
            self._outer_label = self.label
            self._info = ""
        else:
            self._info = None
            self._fence_label = None
            self.label = self._outer_label

    def _append(self, text: str) -> None:
        if self._info is not None:  # the info string runs to the end of the line
            line, newline, text = text.partition("\n")
            self._info += line
            if not newline:
                return
            lang = self._info.strip().lower().split(" ")[0]
            self._info = None
            if lang in ("json", "jsonc", "json5", "jsonl"):
                self._fence_label = "json"
            elif lang not in ("", "text", "txt", "markdown", "md", "plaintext"):
                self._fence_label = "code"
            if self._fence_label:
                self.label = self._fence_label
        if not text:
            return
        self._buf += text
        if len(self._buf) > 2 * self.window:  # trim rarely: amortised O(1) per char
            self._buf = self._buf[-self.window :]
        self._since += len(text)
        if self._since >= self.every:
            self._since = 0
            self._classify()

    def _classify(self) -> None:
        if self._fence_label is None and len(self._buf) >= self.min_chars:
            self.label = detect_content(self._buf[-self.window :])
