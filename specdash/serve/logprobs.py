"""`logprobs` and `top_logprobs`: what the target gave each token it committed, in OpenAI's
shapes. The rows are the target's own (the verify batch's, before any grammar: the model's
distribution, as llama-server reports by default); a token's entry goes out once the text it
spells has been sent, so streamed entries join to the whole answer's, and a stop string's
tokens, never sent, are never reported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOP_CAP = 20  # OpenAI's top_logprobs limit


@dataclass(slots=True)
class TokenLogprob:
    piece: bytes
    logprob: float
    top: list[tuple[bytes, float]]

    def chat(self) -> dict[str, Any]:
        def one(piece: bytes, lp: float) -> dict[str, Any]:
            return {"token": piece.decode("utf-8", "replace"), "logprob": lp, "bytes": list(piece)}

        return {**one(self.piece, self.logprob), "top_logprobs": [one(p, lp) for p, lp in self.top]}


@dataclass
class LogprobLog:
    """One request's entries, released as its text is sent."""

    top: int  # alternatives per token, 0..TOP_CAP
    entries: list[TokenLogprob] = field(default_factory=list)
    _ends: list[int] = field(default_factory=list)  # each entry's end, in bytes of the answer
    released: int = 0  # entries sent so far

    def observe(self, tokens: list[int], rows: np.ndarray, piece: Callable[[int], bytes]) -> None:
        z = np.asarray(rows, dtype=np.float64)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        for token, row in zip(tokens, logp):
            top: list[tuple[bytes, float]] = []
            if self.top:
                best = np.argpartition(-row, self.top)[:self.top]
                top = [(piece(int(t)), float(row[t])) for t in best[np.argsort(-row[best], kind="stable")]]
            p = piece(token)
            self.entries.append(TokenLogprob(p, float(row[token]), top))
            self._ends.append((self._ends[-1] if self._ends else 0) + len(p))

    def release(self, sent_bytes: int) -> list[TokenLogprob]:
        """The entries whose text is now all sent (`sent_bytes`: the answer's bytes so far)."""
        n = self.released
        while n < len(self.entries) and self._ends[n] <= sent_bytes:
            n += 1
        out, self.released = self.entries[self.released:n], n
        return out


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [e.chat() for e in entries], "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions shape; `offset`: where the first entry's text starts."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e.piece.decode("utf-8", "replace"))
    return {"tokens": [e.piece.decode("utf-8", "replace") for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{p.decode("utf-8", "replace"): lp for p, lp in e.top} for e in entries],
            "text_offset": offsets}
