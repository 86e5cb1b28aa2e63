"""A draft model with ANOTHER vocabulary: it drafts text, and the text reaches the engine
as the target's own token ids (HF transformers' "universal assisted decoding").

Both directions go through bytes, never through token strings, so SentencePiece's '▁'
and byte-level BPE's 'Ġ' never meet: a piece is the bytes it stands for.

- Target -> draft (`_sync`): the committed target tokens are mirrored as text, once each
  (`_mirror`: only appended, or cut back where the committed tokens changed). The draft
  model's tokens and KV follow that text: the draft tokens that still spell a prefix of
  it are kept, the last DRAFT_WINDOW of them are re-encoded with the new text after them
  (a BPE merge can cross the old end), and the re-encoding is aligned with what the KV
  holds: only tokens from the first difference on are decoded, the KV is cut back there.
- Draft -> target (`_to_target`): the draft generates K + EXTRA_DRAFT of its own tokens;
  their text is appended to the last TARGET_WINDOW committed target tokens (look-behind),
  re-encoded with the target's tokenizer, and the tokens after the one that ends exactly
  at the committed text are proposed. Committed target ids are never re-encoded into
  anything: the window only decides where the new tokens start. The text is cut to a
  whole UTF-8 character, a trailing word the draft may not have finished is dropped, and
  special tokens never cross: the draft stops at its own specials and end tokens, and the
  target side encodes with parse_special off, so text never becomes a target special.

Exactness does not depend on any of this. The engine verifies the proposed target ids
like any draft (greedy: token match; sampling: `probs=None`, i.e. q one-hot on the
proposed token, which accepts with probability p(token) and otherwise samples the target
without it: exactly the target's distribution). A poor translation costs acceptance only.
"""

from __future__ import annotations

import bisect
import ctypes
import time
from collections.abc import Sequence

import llama_cpp as ll
import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.drafters.draft_model import JointCut, top_prob
from specdash.engine.llm import LLM
from specdash.engine.settings import SamplingParams

SOURCE = "xvocab"  # Draft.source and the step's drafter: a translated draft
DRAFT_WINDOW = 3  # draft tokens before the old end of text that are re-encoded each sync
TARGET_WINDOW = 4  # committed target tokens of look-behind when the draft's text is encoded
# Draft tokens asked beyond K: vocabularies split text differently, and the last target
# token of a translation is often dropped as a possibly unfinished word.
EXTRA_DRAFT = 2


def complete_utf8(data: bytes | bytearray) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character
    (byte fallback and byte-level BPE both split characters across tokens)."""
    n = len(data)
    i = n - 1
    while i >= 0 and n - i <= 4 and 0x80 <= data[i] < 0xC0:  # continuation bytes
        i -= 1
    if i < 0 or n - i > 4:
        return n  # no lead byte within reach: not a character we can complete; leave it
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return n if n - i >= need else i


def _continues_char(b: int) -> bool:
    return 0x80 <= b < 0xC0


def open_ended(piece: bytes) -> bool:
    """Whether text ending with `piece` may still grow into a longer token: it ends with
    a letter or digit (a word cut mid-way; non-ASCII counts as a letter) or with
    whitespace (byte-level BPE joins a space to the word after it)."""
    if not piece:
        return False
    last = piece[-1]
    return last >= 0x80 or chr(last).isalnum() or chr(last).isspace()


class Vocabulary:
    """One model's tokenizer, in bytes. Special tokens render as their text (`<|im_start|>`):
    to the other model a chat marker is text, never one of its special ids."""

    def __init__(self, llm: LLM):
        self.llm = llm
        self._pieces: dict[int, bytes] = {}
        self._special: dict[int, bool] = {}

    def piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.llm.vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.llm.vocab, token, buf, len(buf), 0, True)
            p = self._pieces[token] = buf.raw[:n]
        return p

    def text(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.piece(t) for t in tokens)

    def is_special(self, token: int) -> bool:
        """A control or end-of-generation token: never drafted across vocabularies."""
        v = self._special.get(token)
        if v is None:
            v = self._special[token] = bool(
                ll.llama_vocab_is_control(self.llm.vocab, token) or ll.llama_vocab_is_eog(self.llm.vocab, token))
        return v

    def encode(self, data: bytes, *, parse_special: bool) -> list[int] | None:
        """Tokens spelling exactly `data` (no BOS/EOS added); None when `data` is not whole
        UTF-8 or the tokenizer does not give the same bytes back (e.g. a space prefix)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        tokens = self.llm.tokenize(text, add_special=False, parse_special=parse_special)
        return tokens if self.text(tokens) == data else None


class TranslatedDrafter:
    """Drafts for a target whose vocabulary differs: see the module docstring."""

    name = SOURCE
    free = False

    def __init__(self, llm: LLM, target_vocab: LLM, p_min: float = 0.0, label: str | None = None,
                 relative_cost: float | None = None, p_joint: float = 0.0):
        """llm: the draft model (its own context). target_vocab: the target's vocabulary
        (a vocab_only load is enough; this drafter owns and closes it)."""
        self.llm = llm
        self.draft = Vocabulary(llm)
        self.target = Vocabulary(target_vocab)
        self.p_min = p_min  # draft confidence cuts, as for a same-vocabulary draft model
        self.p_joint = p_joint
        self.label = label or llm.path.stem
        self.relative_cost = relative_cost
        self._bos: list[int] = [llm.bos] if llm.add_bos and llm.bos >= 0 else []
        self._target_bos = target_vocab.bos if target_vocab.add_bos else None
        # The committed target tokens and their text, mirrored once each.
        self._t: list[int] = []
        self._t_end: list[int] = []  # byte offset in _text after each target token
        self._text = bytearray()
        # The draft's tokens in its KV (its BOS first when it adds one) and where each ends.
        self._d: list[int] = []
        self._d_end: list[int] = []
        self._d_ok = 0  # leading draft tokens known to spell _text
        self._translate_ms = 0.0  # the last proposal's translation time
        self._translate_avg = 0.0  # its running average (EMA), for catch_up_ms
        self._token_ms = 0.0  # ms per draft token of a catch-up batch (EMA)
        self._prep_ms = 0.0

    @property
    def k_ceiling(self) -> bool:
        return self.p_joint > 0  # the joint cut ends drafts before K (JointCut)

    def parts(self) -> Sequence[Drafter]:
        return [self]

    # --- target text ------------------------------------------------------------------
    def _common(self, tokens: Sequence[int]) -> int:
        t = self._t
        if len(t) <= len(tokens) and t == list(tokens[: len(t)]):
            return len(t)
        n = 0
        while n < min(len(t), len(tokens)) and t[n] == tokens[n]:
            n += 1
        return n

    def _mirror(self, tokens: Sequence[int]) -> None:
        """The committed target tokens as text: appended after what was mirrored, cut back
        only where the committed tokens changed (another prompt, a stale drafter)."""
        keep = self._common(tokens)
        if keep < len(self._t):
            end = self._t_end[keep - 1] if keep else 0
            del self._t[keep:], self._t_end[keep:], self._text[end:]
            # Draft tokens past the new end of text are no longer known to spell it.
            self._d_ok = min(self._d_ok, bisect.bisect_right(self._d_end, end))
        for tok in tokens[keep:]:
            # The target's BOS is its own business; the draft gets its own BOS.
            if not (not self._t and tok == self._target_bos):
                self._text += self.target.piece(tok)
            self._t.append(tok)
            self._t_end.append(len(self._text))

    # --- target -> draft --------------------------------------------------------------
    def _sync(self, room: int, prefill: bool = False) -> np.ndarray | None:
        """Bring the draft's tokens and KV in step with the mirrored text (up to its last
        whole character); return the draft's logits after it, None when it cannot draft
        (no text yet, no room in its context). `room`: draft tokens to leave free."""
        d, ends, text = self._d, self._d_end, self._text
        limit = complete_utf8(text)
        nb = len(self._bos)
        t0 = time.perf_counter()
        # 1. The draft tokens that still spell the text (drafts the target rejected do not).
        ok = max(min(self._d_ok, len(d)), nb if len(d) >= nb else 0)
        while ok < len(d) and ends[ok] <= limit and \
                text[(ends[ok - 1] if ok else 0):ends[ok]] == self.draft.piece(d[ok]):
            ok += 1
        # 2. Re-encode from DRAFT_WINDOW tokens before their end, on a character boundary.
        keep = max(nb, ok - DRAFT_WINDOW) if len(d) >= nb else 0
        while keep > nb and ends[keep - 1] < len(text) and _continues_char(text[ends[keep - 1]]):
            keep -= 1
        start = ends[keep - 1] if keep else 0
        chunk = bytes(text[start:limit])
        new = self.draft.encode(chunk, parse_special=True) if chunk else []
        if new is None and keep > nb:  # the window's tokenization did not spell it: from the top
            keep, start = nb if len(d) >= nb else 0, 0
            chunk = bytes(text[:limit])
            new = self.draft.encode(chunk, parse_special=True)
        if new is None:
            return None
        if keep == 0:
            new = self._bos + new
        total = keep + len(new)
        if total == 0 or total + room >= self.llm.n_ctx:
            return None
        # 3. Align with what the KV holds: decode from the first difference on.
        pos_ends = [0] * (len(self._bos) if keep == 0 else 0)  # a BOS spells no text
        offset = start
        for tok in new[len(pos_ends):]:
            offset += len(self.draft.piece(tok))
            pos_ends.append(offset)
        full, full_ends = d[:keep] + new, ends[:keep] + pos_ends
        same = keep
        while same < min(len(d), total) and d[same] == full[same]:
            same += 1
        cut = min(same, total - 1)  # the last token is decoded again for its logits
        if cut < len(d):
            self.llm.kv_truncate(cut)
            del d[cut:], ends[cut:]
        feed, feed_ends = full[cut:], full_ends[cut:]
        if prefill:  # the first proposal decodes the last token for its logits
            feed, feed_ends = feed[:-1], feed_ends[:-1]
        t1 = time.perf_counter()
        logits: np.ndarray | None = None
        for i in range(0, len(feed), self.llm.n_batch):
            chunk_tokens = feed[i : i + self.llm.n_batch]
            out = self.llm.decode(chunk_tokens, cut + i, logits=None if prefill else "last")
            if out is not None:
                logits = out[0]
        t2 = time.perf_counter()
        d.extend(feed)
        ends.extend(feed_ends)
        self._d_ok = len(d)
        self._translate_ms += (t1 - t0) * 1e3
        # Re-encoding the window redecodes a token or two each step; more is catch-up
        # (this drafter sat out steps in a chain): a cost of having paused.
        extra = max(len(feed) - 3, 0)
        if feed and not prefill:
            per_token = (t2 - t1) * 1e3 / len(feed)
            self._prep_ms = per_token * extra
            if extra:
                old = self._token_ms
                self._token_ms = per_token if old == 0 else old + 0.25 * (per_token - old)
        return logits

    # --- draft -> target --------------------------------------------------------------
    def _to_target(self, data: bytes, cut_by_budget: bool) -> list[int]:
        """Target tokens continuing the committed ones with the bytes `data`."""
        t, ends, text = self._t, self._t_end, self._text
        n = len(text)
        # Look-behind: the last TARGET_WINDOW committed tokens, none of them special (a
        # special's text would come back as plain text), starting on a whole character.
        w = len(t)
        while w > 0 and len(t) - w < TARGET_WINDOW and not self.target.is_special(t[w - 1]):
            w -= 1
        start = ends[w - 1] if w else 0
        while start < n and _continues_char(text[start]):
            w += 1
            start = ends[w - 1]
        window = bytes(text[start:])
        joined = window + data
        joined = joined[: complete_utf8(joined)]
        if len(joined) <= len(window):
            return []
        tokens = self.target.encode(joined, parse_special=False)
        j, pos = 0, 0
        if tokens is not None:
            while j < len(tokens) and pos < len(window):
                pos += len(self.target.piece(tokens[j]))
                j += 1
        if tokens is None or pos != len(window):
            # A merge crosses the committed end: the new text alone, if it starts whole.
            rest = joined[len(window):]
            tokens = None if _continues_char(rest[0]) else self.target.encode(rest, parse_special=False)
            if tokens is None:
                return []
            j = 0
        out = tokens[j:]
        if out and (cut_by_budget or len(joined) < len(window) + len(data)) and \
                open_ended(self.target.piece(out[-1])):
            out.pop()  # the word may go on: the target would likely split it otherwise
        for i, tok in enumerate(out):
            if self.target.is_special(tok):  # cannot happen with parse_special off; never let one through
                return out[:i]
        return out

    # --- the Drafter protocol ---------------------------------------------------------
    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if k <= 0:
            return Draft.empty(self.name)
        t0 = time.perf_counter()
        self._translate_ms = 0.0
        self._prep_ms = 0.0
        self._mirror(tokens)
        self._translate_ms += (time.perf_counter() - t0) * 1e3
        kd = k + EXTRA_DRAFT
        logits = self._sync(room=kd + 1)
        if logits is None:
            return Draft([], None, self.name, translate_ms=self._translate_ms)
        limit = complete_utf8(self._text)
        d, ends = self._d, self._d_end
        out: list[int] = []
        ended = False
        cut = JointCut(self.p_min, self.p_joint)
        for i in range(kd):
            # The draft's argmax whether or not the target samples: verification with q
            # one-hot accepts it with probability p(token), highest for the likeliest.
            tok = int(np.argmax(logits))
            if self.draft.is_special(tok):
                ended = True  # nothing after an end token, and no specials across vocabularies
                break
            if cut.active and cut.stop(top_prob(logits)):
                break
            out.append(tok)
            if i + 1 < kd:  # the last draft token needs no forward pass of its own
                logits = self.llm.decode([tok], len(d), logits="last")[0]
                d.append(tok)
                ends.append(ends[-1] + len(self.draft.piece(tok)))
        t1 = time.perf_counter()
        data = self.draft.text(out)
        head = bytes(self._text[limit:])  # committed bytes of a character the draft saw whole
        proposal: list[int] = []
        if data.startswith(head) and len(data) > len(head):
            proposal = self._to_target(data[len(head):], cut_by_budget=not ended)[:k]
        self._translate_ms += (time.perf_counter() - t1) * 1e3
        old = self._translate_avg
        self._translate_avg = self._translate_ms if old == 0 else old + 0.25 * (self._translate_ms - old)
        return Draft(proposal, None, self.name, prep_ms=self._prep_ms, translate_ms=self._translate_ms)

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        """Predicted overhead of the next proposal beyond drafting itself: the translation
        (running average) plus catching up on target tokens committed while this drafter
        sat out, at its measured cost per draft token (draft tokens per target token as
        in its context so far)."""
        behind = len(tokens) - self._common(tokens) - 2
        ratio = len(self._d) / len(self._t) if self._t else 1.0
        return self._translate_avg + (behind * ratio * self._token_ms if behind > 0 else 0.0)

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        # In target tokens: the estimate prices them as the target's vocabulary's.
        return 0 if self._token_ms > 0 else max(len(tokens) - self._common(tokens) - 2, 0)

    def prefill(self, tokens: Sequence[int]) -> None:
        self._mirror(tokens)
        self._sync(room=0, prefill=True)
        self._translate_ms = 0.0

    def reset(self) -> None:
        self.llm.clear()
        self._t.clear()
        self._t_end.clear()
        self._text.clear()
        self._d.clear()
        self._d_end.clear()
        self._d_ok = 0

    def forget(self) -> None:
        pass  # nothing is kept across prompts

    def set_cut(self, p_joint: float) -> None:
        self.p_joint = p_joint

    def close(self) -> None:
        self.llm.close()
        self.target.llm.close()
