"""Content detector on labelled snippets, as whole texts and as rolling windows."""

from __future__ import annotations

import json

import pytest

from specdash.engine.detector import CONTENT_TYPES, ContentDetector, detect_content, prompt_prior

CODE = [
    # Python
    '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]


if __name__ == "__main__":
    print(fibonacci(10))
''',
    """import os
import sys
from pathlib import Path


class Config:
    def __init__(self, path: Path):
        self.path = path
        self.values = {}

    def load(self):
        with open(self.path) as fh:
            for line in fh:
                key, _, value = line.partition("=")
                self.values[key.strip()] = value.strip()
        return self
""",
    """    for i, row in enumerate(rows):
        if not row:
            continue
        try:
            total += float(row[2])
        except (ValueError, IndexError) as exc:
            logger.warning("bad row %d: %s", i, exc)
    return total / max(len(rows), 1)
""",
    # JavaScript / TypeScript
    """const express = require("express");
const app = express();

app.get("/api/users/:id", async (req, res) => {
  const user = await db.users.findById(req.params.id);
  if (!user) {
    return res.status(404).json({ error: "not found" });
  }
  res.json(user);
});

app.listen(3000, () => console.log("listening on 3000"));
""",
    """function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

export default debounce;
""",
    """interface Point {
  x: number;
  y: number;
}

export function distance(a: Point, b: Point): number {
  const dx = a.x - b.x;
  const dy = a.y - b.y;
  return Math.sqrt(dx * dx + dy * dy);
}
""",
    # C / C++ / Rust / Go
    """#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s N\\n", argv[0]);
        return 1;
    }
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) {
        printf("%d\\n", i * i);
    }
    return 0;
}
""",
    """static void list_push(struct node **head, int value)
{
    struct node *n = malloc(sizeof(*n));
    n->value = value;
    n->next = *head;
    *head = n;
}
""",
    """fn parse_line(line: &str) -> Option<(String, u32)> {
    let mut parts = line.splitn(2, ':');
    let name = parts.next()?.trim().to_string();
    let count = parts.next()?.trim().parse::<u32>().ok()?;
    Some((name, count))
}
""",
    """func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	defer r.Body.Close()
	s.count++
}
""",
    # Config as code (YAML), SQL, shell
    """services:
  web:
    image: nginx:1.25
    ports:
      - "8080:80"
    volumes:
      - ./site:/usr/share/nginx/html:ro
  db:
    image: postgres:16
    environment:
      POSTGRES_PASSWORD: example
""",
    """SELECT u.id, u.name, COUNT(o.id) AS orders
FROM users u
LEFT JOIN orders o ON o.user_id = u.id
WHERE u.created_at > '2024-01-01'
GROUP BY u.id, u.name
ORDER BY orders DESC
LIMIT 20;
""",
]

JSON = [
    """{
  "name": "specdash",
  "version": "0.1.0",
  "private": true,
  "dependencies": {
    "textual": "^8.0",
    "numpy": ">=1.26"
  }
}""",
    """[
  {"id": 1, "title": "Buy milk", "done": false},
  {"id": 2, "title": "Write report", "done": true},
  {"id": 3, "title": "Call Alice", "done": false}
]""",
    """{"model": "qwen2.5-coder-1.5b", "k": 4, "temperature": 0.0, "tokens_per_s": 41.2, "acceptance": 0.78}""",
    """    "address": {
      "street": "12 Rue de la Paix",
      "city": "Paris",
      "zip": "75002",
      "country": "FR"
    },
    "phones": ["+33 1 23 45 67 89", "+33 6 12 34 56 78"],
    "active": true,""",
    """{
  "type": "FeatureCollection",
  "features": [
    {
      "type": "Feature",
      "geometry": {"type": "Point", "coordinates": [102.0, 0.5]},
      "properties": {"prop0": "value0"}
    }
  ]
}""",
    """[
  [1, 2, 3, 4],
  [5, 6, 7, 8],
  [9, 10, 11, 12]
]""",
    """{
  "error": {
    "code": 429,
    "message": "Too many requests, please retry after 30 seconds.",
    "details": [{"reason": "rateLimitExceeded", "domain": "usageLimits"}]
  }
}""",
    """{"role": "user", "content": "What is the capital of France?"}
{"role": "assistant", "content": "The capital of France is Paris."}
{"role": "user", "content": "And of Italy?"}""",
    """  "scripts": {
    "build": "tsc -p .",
    "test": "vitest run",
    "lint": "eslint src --ext .ts"
  },
  "engines": {"node": ">=18"},""",
]

PROSE = [
    """Speculative decoding speeds up inference by letting a small draft model propose several
tokens that the large target model then verifies in a single forward pass. When the draft
agrees with the target, several tokens are committed for the price of one step; when it
does not, the target's own token is used and nothing is lost except the wasted draft work.""",
    """The committee met on Tuesday to discuss the budget for next year. Most members agreed that
the maintenance fund should grow, but there was a long debate about whether the new library
wing could wait another year. In the end, the vote was postponed until more estimates arrive.""",
    """I think the best way to learn a new language is to use it every day, even if only for a few
minutes. Read something you enjoy, write a short note, and don't worry about mistakes: they
are how you find out what you still need to practise.""",
    """## Installation

Install the package with pip and make sure the models are cached before you start the
dashboard. The first run downloads nothing: everything it needs comes from the cache.

- **Target**: the large model whose output you want.
- **Draft**: a small model with the same tokenizer.
- **K**: how many tokens are drafted per step.""",
    """# Release notes

This release focuses on stability. We fixed a crash when the terminal was resized during a
screenshot, made the acceptance chart keep a fixed axis, and improved the error message shown
when a model file cannot be found. Thanks to everyone who reported issues!""",
    """Here is a summary of the main points:

1. The target model alone reaches about 34 tokens per second on this machine.
2. A draft model is only 1.7 times faster, so it rarely pays off.
3. Free drafts such as prompt lookup can still win on repetitive text.""",
    """Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker
who never let anyone see his workshop. Every evening the children would gather outside his
window, hoping to catch a glimpse of the strange machines that ticked and whirred inside.""",
    """Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide
to produce glucose and oxygen. It takes place mainly in the leaves, inside small structures
called chloroplasts, which contain the pigment chlorophyll.""",
    """The function `fibonacci` returns a list with the first n numbers of the sequence. It starts
from `[0, 1]` and keeps appending the sum of the last two items until the list is long enough.
For n smaller than two, it simply slices the starting list.""",
    """Thank you for your message. Unfortunately, the meeting room is not available on Friday
afternoon, but I could book it for Thursday at 3 pm instead. Let me know if that works for
you and I will send an invitation to the whole team.""",
]

LABELLED = [(t, "code") for t in CODE] + [(t, "json") for t in JSON] + [(t, "prose") for t in PROSE]


def test_snippet_counts_and_labels_are_known():
    assert len(CODE) >= 8 and len(JSON) >= 8 and len(PROSE) >= 8
    assert {"code", "json", "prose"} <= set(CONTENT_TYPES)
    assert json.loads(JSON[0])  # the corpus itself is realistic: whole JSON parses


@pytest.mark.parametrize("label", ["code", "json", "prose"])
def test_accuracy_per_class_on_whole_snippets(label):
    texts = [t for t, lab in LABELLED if lab == label]
    wrong = [(detect_content(t), t[:50]) for t in texts if detect_content(t) != label]
    accuracy = 1 - len(wrong) / len(texts)
    assert accuracy >= 0.9, f"{label}: accuracy {accuracy:.2f}, misclassified: {wrong}"


def _windows(text: str, size: int = 160, stride: int = 37):
    for start in range(0, max(1, len(text) - size + 1), stride):
        yield text[start : start + size]


def test_accuracy_on_rolling_windows_cut_anywhere():
    """The detector sees the last few hundred characters, cut mid-line: it must still work."""
    results = [(detect_content(w) == lab, lab, w) for t, lab in LABELLED for w in _windows(t)]
    assert len(results) > 60
    wrong = [(lab, w[:40]) for ok, lab, w in results if not ok]
    accuracy = 1 - len(wrong) / len(results)
    assert accuracy >= 0.85, f"window accuracy {accuracy:.2f}; misclassified: {wrong}"


def test_degenerate_inputs_have_a_label():
    for text in ["", "   \n", "}", "ok", "42"]:
        assert detect_content(text) in CONTENT_TYPES


def test_prompt_prior_reads_intent_and_embedded_content():
    assert prompt_prior("Write a Python function that reverses a linked list.") == "code"
    assert prompt_prior("Implement quicksort in C.") == "code"
    assert prompt_prior("Return the user record as JSON with fields name and age.") == "json"
    assert prompt_prior("Tell me a story about a lighthouse keeper.") == "prose"
    assert prompt_prior("Explain what this does:\n" + CODE[0]) == "code"


def _feed(det: ContentDetector, text: str, piece: int = 3) -> list[str]:
    return [det.update(text[i : i + piece]) for i in range(0, len(text), piece)]


def test_detector_uses_prompt_prior_until_it_has_seen_enough():
    det = ContentDetector()
    det.reset("Write a Python function that parses a CSV line.")
    labels = _feed(det, "Sure! Here")
    assert set(labels) == {"code"}
    labels = _feed(det, " is what I would do in plain words, step by step. " + PROSE[0])
    assert labels[-1] == "prose"


def test_detector_follows_fenced_blocks_across_split_pieces():
    det = ContentDetector()
    det.reset("Tell me about Fibonacci numbers and show some code.")
    text = (
        "The Fibonacci numbers grow quickly; each is the sum of the two before it.\n\n"
        "```python\n" + CODE[0] + "```\n\n"
        "And here is the same data as JSON:\n\n```json\n" + JSON[0] + "\n```\n\n" + PROSE[2]
    )
    seen: list[tuple[int, str]] = []
    pos = 0
    for i in range(0, len(text), 2):  # 2-char pieces: every fence is split somewhere
        seen.append((pos, det.update(text[i : i + 2])))
        pos += 2

    def label_at(marker: str, offset: int = 40) -> str:
        at = text.index(marker) + offset
        return next(lab for p, lab in seen if p >= at)

    assert label_at("def fibonacci") == "code"
    assert label_at('"dependencies"') == "json"
    assert seen[-1][1] == "prose"


def test_detector_switches_on_unfenced_change_of_content():
    det = ContentDetector(window=400, every=32)
    det.reset("")
    _feed(det, PROSE[0] + "\n\n" + PROSE[1])
    assert det.label == "prose"
    _feed(det, "\n\n" + CODE[1] + CODE[4])
    assert det.label == "code"


def test_update_is_cheap_between_classifications():
    det = ContentDetector(every=64)
    det.reset("")
    calls = 0
    original = det._classify

    def counting() -> None:
        nonlocal calls
        calls += 1
        original()

    det._classify = counting  # type: ignore[method-assign]
    _feed(det, PROSE[0] * 3, piece=4)
    assert 0 < calls <= len(PROSE[0] * 3) // 64 + 1
