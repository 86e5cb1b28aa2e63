"""One loaded GGUF model and its context, on llama-cpp-python's low-level API.

Why low-level: speculative verification needs logits for exactly the K+1 positions of a
batch (not the whole context: at 151,936 vocab entries that is ~0.6 MB per position) and
KV-cache rollback of rejected positions. The high-level `Llama` class does neither cheaply.
"""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence, overload

import numpy as np
import llama_cpp as ll

from specdash.engine import repack
from specdash.models.llamalog import clear_tail, last_log_error
from specdash.engine.rollback import Strategy, snapshot_budget
from specdash.engine.rollback import probe as probe_rollback
from specdash.contract import faults
from specdash.contract.errors import SpecdashError
from specdash.telemetry.cpu import physical_cores

ll.llama_backend_init()


class DecodeObserver(Protocol):
    """Sees every decode of a context, right after it (an MTP head reads the target's
    hidden rows of the batch), and every clear."""

    def decoded(self, tokens: Sequence[int], start_pos: int) -> None: ...

    def cleared(self) -> None: ...


def _kv_override_array(overrides: dict[str, int | float | bool]) -> Any:
    arr: Any = (ll.llama_model_kv_override * (len(overrides) + 1))()
    for i, (key, value) in enumerate(overrides.items()):
        arr[i].key = key.encode()
        if isinstance(value, bool):
            arr[i].tag, arr[i].value.val_bool = ll.LLAMA_KV_OVERRIDE_TYPE_BOOL, value
        elif isinstance(value, int):
            arr[i].tag, arr[i].value.val_i64 = ll.LLAMA_KV_OVERRIDE_TYPE_INT, value
        else:
            arr[i].tag, arr[i].value.val_f64 = ll.LLAMA_KV_OVERRIDE_TYPE_FLOAT, float(value)
    arr[len(overrides)].key = b""  # sentinel
    return arr


class LLM:
    """A model + context, with one sequence (seq 0) unless made with n_seq > 1 (a server's
    batch: engine/batch). Not thread-safe: one owner thread."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        kv_overrides: dict[str, int | float | bool] | None = None,
        vocab_only: bool = False,
        n_rs_seq: int = 0,
        repack_setting: str = "auto",
        load_mtp: bool = False,
        n_seq: int = 1,
    ):
        """n_rs_seq: recurrent-state snapshots to ask for (the longest draft to take back
        without a checkpoint); llama.cpp keeps them only for some architectures, and a KV
        cache ignores it. `self.strategy` says what the context really has.
        repack_setting: weight repacking (engine/repack.py); "auto" probes once per machine.
        load_mtp: load the model's multi-token-prediction head too, where it has one
        (llama.cpp skips those tensors otherwise); `self.mtp_loaded` says if it did.
        n_seq: sequences the context holds, each with n_ctx positions of its own (llama.cpp's
        streams: a sequence attends only to its own rows), for several requests in one batch."""
        self.path = Path(path)
        self.kv_overrides = dict(kv_overrides or {})
        # A vocabulary-only load places no weights: nothing to decide, no probe to run.
        self.repack = repack.Verdict("off", "off", "setting") if vocab_only else repack.resolve(repack_setting)
        mparams = ll.llama_model_default_params()
        mparams.vocab_only = vocab_only
        mparams.load_mtp = load_mtp and not vocab_only
        if self.kv_overrides:
            self._kv_arr = _kv_override_array(self.kv_overrides)  # must outlive the load
            mparams.kv_overrides = self._kv_arr
        placement = repack.ModelParams(mparams, self.path, self.repack)  # must outlive the load
        clear_tail()
        self.model = ll.llama_model_load_from_file(str(self.path).encode(), mparams)
        del placement
        if not self.model:
            why = last_log_error() or "llama.cpp could not load it"
            raise SpecdashError(f"{self.path}: failed to load model: {why}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.bos = ll.llama_vocab_bos(self.vocab)
        self.eos = ll.llama_vocab_eos(self.vocab)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        # What sits in the memory of seq 0, position by position, and how many leading
        # rows a prefill_prompt wrote (the prompt cache: see prefill_prompt).
        self._rows: list[int] = []
        self._prefilled = 0
        # The same for every other sequence (n_seq > 1): seq id -> its rows.
        self._seq_rows: dict[int, list[int]] = {0: self._rows}
        self.n_seq = max(1, n_seq)
        self.ctx = None
        self._batch = None
        self.strategy = Strategy("kv")
        # Heads the GGUF declares. llama.cpp reports them whether or not it loaded them,
        # and an MTP context on a head it skipped aborts the process: hence mtp_loaded.
        self.n_mtp_layers = max(0, int(ll.llama_model_n_layer_nextn(self.model))) if not vocab_only else 0
        self.mtp_loaded = bool(load_mtp and self.n_mtp_layers)
        # Who wants to see every decode of this context (an MTP head copies the target's
        # hidden rows); called after each decode and on clear().
        self.observers: list[DecodeObserver] = []
        if vocab_only:
            return
        self.n_threads = n_threads or physical_cores().count
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx * self.n_seq
        cparams.n_seq_max = self.n_seq
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        # llama.cpp aborts (GGML_ASSERT in llama-batch.cpp) unless n_ubatch > n_rs_seq + 1.
        requested = max(0, min(n_rs_seq, n_batch - 2))
        n_rs_seq, refused = 0, ""
        if requested and (ll.llama_model_is_recurrent(self.model) or ll.llama_model_is_hybrid(self.model)):
            # Only a recurrent state keeps snapshots, and too many abort context creation.
            n_rs_seq, refused = snapshot_budget(str(self.path), requested, n_ctx, n_batch, self.repack.mode)
        cparams.n_rs_seq = n_rs_seq
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            why = last_log_error()
            ll.llama_model_free(self.model)
            self.model = None
            raise SpecdashError(f"{self.path}: failed to create a context (n_ctx={n_ctx}): {why}")
        self.n_ctx = ll.llama_n_ctx_seq(self.ctx)  # what one sequence holds
        self.n_batch = n_batch
        self.mem = ll.llama_get_memory(self.ctx)
        self._batch = ll.llama_batch_init(n_batch, 0, 1)
        self.strategy = probe_rollback(self, requested)
        if refused and self.strategy.n_rs_seq < requested:
            self.strategy = dataclasses.replace(self.strategy, refused=refused)

    # --- metadata -------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n >= len(buf):  # snprintf's rule: n is the whole length (a long chat template)
            buf = ctypes.create_string_buffer(n + 1)
            n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def arch(self) -> str:
        return self.meta("general.architecture") or "unknown"

    # --- text <-> tokens ------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes of one token (may be part of a UTF-8 character). Cached: called per token."""
        p = self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            p = self._pieces[token] = buf.raw[:n]
        return p

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        v = self._eog.get(token)
        if v is None:
            v = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token))
        return v

    def chat_prompt(self, user_text: str) -> str:
        """Wrap a user message in the model's own chat template (GGUF metadata)."""
        return self.chat_text([("user", user_text)])

    def chat_text(self, messages: Sequence[tuple[str, str]]) -> str:
        """A conversation, (role, content) in order, in the model's own chat template (GGUF
        metadata), ready for the assistant's turn."""
        tmpl = ll.llama_model_chat_template(self.model, None)
        if not tmpl:
            raise SpecdashError(
                f"{self.path.name}: the model has no chat template in its GGUF metadata; use --raw"
            )
        msgs = (ll.llama_chat_message * len(messages))()
        keep = []  # the encoded strings must outlive the call
        for i, (role, content) in enumerate(messages):
            r, c = role.encode("utf-8"), content.encode("utf-8")
            keep += [r, c]
            msgs[i].role, msgs[i].content = r, c
        size = sum(len(x) for x in keep) * 2 + 1024
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, msgs, len(messages), True, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = ll.llama_chat_apply_template(tmpl, msgs, len(messages), True, buf, n)
        if n < 0:
            raise SpecdashError(
                f"{self.path.name}: llama.cpp does not support this model's chat template; use --raw"
            )
        return buf.raw[:n].decode("utf-8", "replace")

    # --- decoding -------------------------------------------------------------------
    @overload
    def decode(self, tokens: Sequence[int], start_pos: int, logits: Literal["all", "last"] = "all",
               seq: int = 0) -> np.ndarray: ...

    @overload
    def decode(self, tokens: Sequence[int], start_pos: int, logits: None, seq: int = 0) -> None: ...

    def decode(self, tokens: Sequence[int], start_pos: int, logits: Literal["all", "last"] | None = "all",
               seq: int = 0) -> np.ndarray | None:
        """Decode `tokens` at positions start_pos.. in one batch (must fit n_batch).

        logits: "all" -> (len, n_vocab) rows, "last" -> (1, n_vocab), None -> nothing.
        The returned array is a VIEW of llama.cpp's buffer: valid until the next decode.
        """
        n = len(tokens)
        if n == 0 or n > self.n_batch:
            raise ValueError(f"batch of {n} tokens (n_batch={self.n_batch})")
        rows = self._decode([(seq, tokens, start_pos)], logits == "all", logits == "last")
        if seq == 0:
            for observer in self.observers:
                observer.decoded(tokens, start_pos)
        return None if logits is None else self._logits(rows)

    def decode_seqs(self, parts: Sequence[tuple[int, Sequence[int], int]]) -> np.ndarray:
        """Several sequences in one batch: (seq, tokens, start_pos) each, logits for every
        row, in the order given (a VIEW, valid until the next decode). No observer sees it:
        an MTP head follows seq 0 alone, and a batched server drafts without one."""
        n = sum(len(tokens) for _, tokens, _ in parts)
        if n == 0 or n > self.n_batch:
            raise ValueError(f"batch of {n} tokens (n_batch={self.n_batch})")
        return self._logits(self._decode(parts, True, False))

    def _decode(self, parts: Sequence[tuple[int, Sequence[int], int]], want_all: bool, last: bool) -> int:
        """Fill the batch, decode it, keep each sequence's rows; how many logit rows."""
        b: Any = self._batch
        i = 0
        for seq, tokens, start_pos in parts:
            if not 0 <= seq < self.n_seq:
                raise ValueError(f"sequence {seq} (the context holds {self.n_seq})")
            for j, tok in enumerate(tokens):
                b.token[i] = tok
                b.pos[i] = start_pos + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = want_all
                i += 1
            if start_pos != len(self._rows_of(seq)):
                self._cut_rows(start_pos, seq)
        b.n_tokens = i
        if last:
            b.logits[i - 1] = True
        rc = ll.llama_decode(self.ctx, b)
        injected = rc == 0 and faults.decode_fails()  # on purpose (contract/faults.py): the path below
        if rc != 0 or injected:
            for seq, _, start_pos in parts:  # what llama.cpp kept of a failed batch is not known
                self._cut_rows(start_pos, seq)
            why = f"injected by ${faults.ENV}" if injected else last_log_error()
            raise RuntimeError(f"llama_decode failed with code {rc if rc else -3}: {why}")
        for seq, tokens, _ in parts:
            self._rows_of(seq).extend(tokens)
        return i if want_all else 1

    def _logits(self, rows: int) -> np.ndarray:
        ptr = ll.llama_get_logits(self.ctx)
        out: np.ndarray = np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))
        return out

    def prefill(self, tokens: Sequence[int], start_pos: int = 0, seq: int = 0) -> None:
        """Decode a long sequence in n_batch chunks without logits."""
        for i in range(0, len(tokens), self.n_batch):
            self.decode(tokens[i : i + self.n_batch], start_pos + i, logits=None, seq=seq)

    def prefill_seq(self, seq: int, tokens: Sequence[int]) -> int:
        """prefill_prompt(tokens, any_rows=True) for sequence `seq`: every row it already
        holds that `tokens` starts with is kept (a recurrent state cannot be cut back: it
        is cleared instead). Returns the tokens reused."""
        if seq == 0:
            return self.prefill_prompt(tokens, any_rows=True)
        keep = 0
        if self.strategy.kind == "kv":
            for a, b in zip(self._rows_of(seq), tokens):
                if a != b:
                    break
                keep += 1
        self.kv_truncate(keep, seq)
        self.prefill(tokens[keep:], keep, seq)
        return keep

    def prefill_prompt(self, tokens: Sequence[int], any_rows: bool = False) -> int:
        """Bring the memory to exactly `tokens` from position 0, like clear() + prefill(),
        reusing what an earlier prefill_prompt left: the same prompt again (a sweep, a
        bench round, the next K of a test) costs no prefill. Returns the tokens reused.

        Only rows that a fresh prefill would compute bit for bit are kept: llama.cpp
        computes a chunk of n_batch tokens in one batch, so rows are kept whole chunks at
        a time (or all of them for the very same prompt). A row written any other way (a
        decode after the prompt) is never reused. Recurrent state cannot be cut back to a
        prefix, so a recurrent or hybrid model always prefills afresh.

        any_rows: keep every row `tokens` starts with, decoded ones too (a chat's next turn:
        engine.RunOptions.reuse_rows), as llama-server's prompt cache does."""
        keep = 0
        if self.strategy.kind == "kv":
            done = self._rows if any_rows else self._rows[: self._prefilled]
            common = 0
            for a, b in zip(done, tokens):
                if a != b:
                    break
                common += 1
            same = common == len(tokens) == len(done)
            keep = common if any_rows or same else common // self.n_batch * self.n_batch
        if keep:
            self.kv_truncate(keep)
        elif self.n_seq > 1:  # other sequences hold other requests' rows: empty seq 0 alone
            self.kv_truncate(0)
            for observer in self.observers:
                observer.cleared()
        else:
            self.clear()
        self.prefill(tokens[keep:], keep)
        if not (any_rows and keep):
            # Rows after kept decoded ones are no fresh prefill's: never reused by chunks.
            self._prefilled = len(tokens)
        return keep

    def kv_truncate(self, n_keep: int, seq: int = 0) -> None:
        """Drop every KV entry of `seq` at position >= n_keep (rejected drafts)."""
        if n_keep < len(self._rows_of(seq)):
            self._cut_rows(n_keep, seq)
        if not ll.llama_memory_seq_rm(self.mem, seq, n_keep, -1):
            raise RuntimeError(f"llama_memory_seq_rm failed at position {n_keep} of sequence {seq}")

    def clear(self) -> None:
        for seq in self._seq_rows:
            self._cut_rows(0, seq)
        ll.llama_memory_clear(self.mem, True)
        for observer in self.observers:
            observer.cleared()

    @property
    def rows(self) -> list[int]:
        """The tokens in the memory of seq 0, position by position (a copy)."""
        return list(self._rows)

    def seq_rows(self, seq: int) -> list[int]:
        """The tokens in the memory of sequence `seq` (a copy)."""
        return list(self._rows_of(seq))

    def _rows_of(self, seq: int) -> list[int]:
        return self._seq_rows.setdefault(seq, [])

    def _cut_rows(self, n: int, seq: int = 0) -> None:
        del self._rows_of(seq)[n:]
        if seq == 0:
            self._prefilled = min(self._prefilled, n)

    def close(self) -> None:
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:  # a best effort: native memory is large (GBs)
        try:
            self.close()
        except Exception:
            pass
