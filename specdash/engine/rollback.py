"""Taking back rejected draft tokens, on memories that cannot simply drop a tail.

A KV cache drops its last positions with `llama_memory_seq_rm`. A recurrent state (Mamba,
LFM2's short convolutions, gated delta-nets) has already absorbed them: llama.cpp refuses
the tail removal and changes nothing (on a hybrid, the attention part is not cut either).
The vendored llama.cpp offers two cures, and which one a context has is asked of the
context itself, the way llama.cpp's common_context_can_seq_rm does, never read from a
list of architecture names:

- "snapshots": a context created with `n_rs_seq` > 0 keeps that many past recurrent states
  per decode, and one tail removal of up to n_rs_seq tokens per decode succeeds.
  llama.cpp grants it only to some architectures (llm_arch_supports_rs_rollback) and
  silently clamps the rest to 0, so `llama_n_rs_seq(ctx)` is read back after creation.
- "checkpoint": everywhere else, save the recurrent part of the state
  (`llama_state_seq_get_data_ext` with PARTIAL_ONLY) before a batch that may be partly
  rejected; on a rejection restore it, drop the attention tail (which now succeeds: the
  recurrent side already stands there) and decode the kept tokens again.

"kv" is an ordinary KV cache; "none" a memory where neither works (the engine then
decodes plainly, K=0, and says why).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import llama_cpp as ll
import numpy as np

if TYPE_CHECKING:
    from specdash.engine.llm import LLM

PARTIAL = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass(frozen=True, slots=True)
class Strategy:
    kind: str  # "kv" | "snapshots" | "checkpoint" | "none"
    n_rs_seq: int = 0  # snapshots kept per decode (the longest draft they can take back)
    checkpoint_bytes: int = 0  # the partial state's size at the probe; 0: no checkpoint works
    requested: int = 0  # the n_rs_seq asked for; more than n_rs_seq: clamped (llama.cpp, graph size)
    why: str = ""  # for "none": what llama.cpp refused
    refused: str = ""  # how the last snapshot count that was refused ended, e.g. "n_rs_seq 32: killed by SIGABRT"

    @property
    def max_draft(self) -> int | None:
        """The longest draft this context can take back; None: any (a KV cache, or a
        checkpoint for drafts the snapshots do not reach)."""
        if self.kind == "none":
            return 0
        if self.kind == "snapshots" and not self.checkpoint_bytes:
            return self.n_rs_seq
        return None

    def describe(self) -> str:
        """What the operator sees: "" for a KV cache (nothing to say)."""
        if self.kind == "snapshots":
            return f"snapshots (n_rs_seq {self.n_rs_seq})"
        if self.kind == "checkpoint":
            return f"checkpoint {_size(self.checkpoint_bytes)} + replay"
        if self.kind == "none":
            return "none: plain decoding"
        return ""


    def notice(self, arch: str) -> tuple[str, str] | None:
        """(level, message) telling the operator how an `arch` target takes drafts back;
        None for a KV cache."""
        if self.kind == "none":
            return "warning", (f"{arch} target: llama.cpp can take back no rejected draft here ({self.why}); "
                               "decoding plainly (K=0)")
        if self.kind == "snapshots":
            fewer = (f" ({self.requested} would overflow llama.cpp's compute graph: {self.refused})"
                     if self.requested > self.n_rs_seq else "")
            longer = "; longer ones use a checkpoint" if self.checkpoint_bytes else ""
            # Each snapshot is one more copy of the recurrent state, which the checkpoint holds.
            memory = f", +{_size(self.n_rs_seq * self.checkpoint_bytes)} of state" if self.checkpoint_bytes else ""
            return "info", (f"{arch} target keeps recurrent-state snapshots (n_rs_seq {self.n_rs_seq}{fewer}{memory}): "
                            f"drafts up to {self.n_rs_seq} tokens are taken back without replay{longer}")
        if self.kind == "checkpoint":
            clamped = (f" (llama.cpp kept no recurrent-state snapshots for {arch}: n_rs_seq {self.requested} "
                       "asked, 0 granted" + (f"; {self.refused}" if self.refused else "") + ")"
                       if self.requested else "")
            return "info", (f"{arch} target: its recurrent state is checkpointed ({self.describe()}) before each "
                            f"verify batch and restored after a rejection, then the kept tokens are decoded "
                            f"again{clamped}")
        return None


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1e3:.1f} KB"
    return f"{n / 1e6:.1f} MB"


class Checkpoint:
    """One saved copy of the partial (recurrent + SWA) state of seq 0, in a buffer reused
    from save to save: at tens of MB for a large hybrid, a fresh buffer per step would
    cost page faults every step."""

    def __init__(self) -> None:
        self._buf: Any = None
        self.nbytes = 0

    def save(self, llm: LLM) -> None:
        size = ll.llama_state_seq_get_size_ext(llm.ctx, 0, PARTIAL)
        if self._buf is None or len(self._buf) < size:
            self._buf = (ctypes.c_uint8 * size)()
        n = ll.llama_state_seq_get_data_ext(llm.ctx, self._buf, size, 0, PARTIAL)
        if n == 0:
            raise RuntimeError("llama_state_seq_get_data_ext saved nothing")
        self.nbytes = n

    def restore(self, llm: LLM) -> None:
        if not self.nbytes or ll.llama_state_seq_set_data_ext(llm.ctx, self._buf, self.nbytes, 0, PARTIAL) == 0:
            raise RuntimeError("llama_state_seq_set_data_ext could not restore the checkpoint")


# Creates a context with n_rs_seq snapshots and exits 0, or dies trying (see snapshot_budget).
_TRY_CONTEXT = """
import sys, llama_cpp as ll
from specdash.engine.repack import ModelParams, Verdict
ll.llama_backend_init()
path, n_rs, n_ctx, n_batch = sys.argv[1], *map(int, sys.argv[2:5])
mp = ll.llama_model_default_params()
keep = ModelParams(mp, path, Verdict(sys.argv[5], sys.argv[5], "setting"))
model = ll.llama_model_load_from_file(path.encode(), mp)
cp = ll.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_rs_seq, cp.n_threads, cp.n_threads_batch = n_ctx, n_batch, n_batch, n_rs, 1, 1
sys.exit(0 if model and ll.llama_init_from_model(model, cp) else 3)
"""


def snapshot_budget(path: str, requested: int, n_ctx: int, n_batch: int,
                    repack_mode: str = "on") -> tuple[int, str]:
    """The most snapshots, up to `requested`, a context of this model can be created with,
    and how the last refused count ended ("" when the first count worked).

    Each snapshot adds copy nodes per recurrent layer to llama.cpp's compute graph, whose
    size is fixed from the model's tensor count (llama_context::graph_max_nodes): past it,
    context creation aborts the whole process (GGML_ASSERT in ggml-backend.cpp; measured:
    the 4-layer lfm2 fixture takes n_rs_seq 48, not 64). An abort cannot be caught, so
    each count is tried in a child process first (the model is memory-mapped, ~1 s),
    halving until one is created; 0 if none is. The child loads weights as the engine
    does (`repack_mode`)."""
    from specdash.engine.repack import describe_exit

    n, failure = requested, ""
    while n > 0:
        try:
            # The graph's size does not depend on the context length: a short one spares
            # the child a second full-size KV cache.
            proc = subprocess.run([sys.executable, "-c", _TRY_CONTEXT, path, str(n), str(min(n_ctx, n_batch)),
                                   str(n_batch), repack_mode],
                                  capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            failure = f"n_rs_seq {n}: timed out after 300 s"
        else:
            if proc.returncode == 0:
                return n, failure
            failure = f"n_rs_seq {n}: {describe_exit(proc.returncode, proc.stderr)}"
        n //= 2
    return 0, failure


def probe(llm: LLM, requested: int) -> Strategy:
    """Which strategy this context has, found by trying. Leaves the memory empty."""
    n_rs = int(ll.llama_n_rs_seq(llm.ctx))
    try:
        if n_rs == 0:
            # As common_context_can_seq_rm: decode two tokens, try to drop the second.
            llm.clear()
            llm.decode([0, 0], 0, logits=None)
            if ll.llama_memory_seq_rm(llm.mem, 0, 1, -1):
                return Strategy("kv", requested=requested)
        ckpt = _checkpoint_round_trip(llm)
    except RuntimeError as exc:
        ckpt, why = 0, str(exc)
    else:
        why = "" if ckpt else "a restored state checkpoint does not take the memory back"
    finally:
        llm.clear()
    if n_rs > 0:  # a checkpoint is still wanted for drafts longer than the snapshots reach
        return Strategy("snapshots", n_rs, ckpt, requested)
    if ckpt:
        return Strategy("checkpoint", 0, ckpt, requested)
    return Strategy("none", requested=requested, why=f"no tail removal and {why}")


def _checkpoint_round_trip(llm: LLM) -> int:
    """The engine's checkpoint path in miniature: one token in, save, one more, restore,
    drop the tail. The checkpoint's size when the memory is back at one token, else 0."""
    llm.clear()
    llm.decode([0], 0, logits=None)
    ckpt = Checkpoint()
    ckpt.save(llm)
    llm.decode([0], 1, logits=None)
    ckpt.restore(llm)
    if not ll.llama_memory_seq_rm(llm.mem, 0, 1, -1) or ll.llama_memory_seq_pos_max(llm.mem, 0) != 0:
        return 0
    return ckpt.nbytes


@dataclass
class Calibration:
    """What adaptive K's one-time measurement found (ms): per target batch of n tokens,
    and on a checkpoint target the save, the restore and a replay of n tokens."""

    ms: dict[int, float]
    save_ms: float = 0.0
    restore_ms: float = 0.0
    replay_ms: dict[int, float] = field(default_factory=dict)


def calibrate(llm: LLM, n_past: int, tokens: Sequence[int], sizes: Sequence[int], *, replay: bool) -> Calibration:
    """Time junk batches of each size at n_past (logits for all rows, as a verify), then
    take them back: a KV cache drops them; a recurrent state is checkpointed before and
    restored after, which times the save and restore on the way, and with `replay` the
    same batch without logits (median of 3: it prices every rejection from then on, and
    unlike the batch costs nothing refines it online)."""
    ckpt = Checkpoint() if llm.strategy.kind != "kv" else None
    out = Calibration({})
    save: list[float] = []
    restore: list[float] = []

    def back() -> float:
        t = time.perf_counter()
        if ckpt is not None:
            ckpt.restore(llm)
        ms = (time.perf_counter() - t) * 1e3
        llm.kv_truncate(n_past)
        return ms

    # Two passes, the faster of each kept: one sample stretched by another process's time
    # slice bends the curve (a slow s(1) makes every batch look cheap, and the controller
    # then drafts where plain decoding wins).
    for n in [*sizes, 1, *sizes]:
        junk = (list(tokens) * n)[-n:]  # any valid tokens: only the time is kept
        if ckpt is not None:
            t = time.perf_counter()
            ckpt.save(llm)
            save.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        llm.decode(junk, n_past, logits="all")
        out.ms[n] = min(out.ms.get(n, float("inf")), (time.perf_counter() - t) * 1e3)
        restore.append(back())
        if ckpt is not None and replay and n not in out.replay_ms:
            times = []
            for _ in range(3):
                t = time.perf_counter()
                llm.decode(junk, n_past, logits=None)
                times.append((time.perf_counter() - t) * 1e3)
                back()
            out.replay_ms[n] = float(np.median(times))
    if ckpt is not None and save:
        out.save_ms, out.restore_ms = float(np.median(save)), float(np.median(restore))
    return out


class Rollback:
    """One context's way back after a verify batch: the engine calls `before(n_past,
    n_draft)` before decoding [last, draft...] at n_past and `keep(n_keep, batch)` when
    only the first n_keep positions may stay. `ms` accumulates the time spent saving,
    restoring and replaying (the engine reads and resets it per step)."""

    def __init__(self, llm: LLM):
        self.llm = llm
        self.strategy: Strategy = llm.strategy
        self._ckpt = Checkpoint()
        self._saved_at = -1  # the position the checkpoint stands at; -1: none for this batch
        self.saved_bytes = 0  # bytes checkpointed before the last batch
        self.ms = 0.0
        self.used = ""  # the strategy the last batch used: "", "snapshots" or "checkpoint"
        # Test-only: how many of the next rejections to corrupt (the first rejected token
        # leaks into the state), so a test can show the exactness check catches a broken rollback.
        self.corrupt = 0

    def before(self, n_past: int, n_draft: int) -> None:
        self._saved_at, self.used, self.saved_bytes = -1, "", 0
        kind = self.strategy.kind
        if n_draft == 0 or kind == "kv":
            return
        if kind == "snapshots" and n_draft <= self.strategy.n_rs_seq and not self.corrupt:
            self.used = "snapshots"
            return
        # A checkpoint target, or a draft longer than the snapshots reach (a K set above
        # the k_max the context was created for): this batch takes a checkpoint.
        t = time.perf_counter()
        self._ckpt.save(self.llm)
        self.ms += (time.perf_counter() - t) * 1e3
        self._saved_at, self.used, self.saved_bytes = n_past, "checkpoint", self._ckpt.nbytes

    def keep(self, n_keep: int, batch: Sequence[int]) -> None:
        """Keep positions < n_keep; `batch` is the verify batch decoded at the saved
        position (its first n_keep - saved tokens are the ones kept)."""
        if self._saved_at < 0:
            self.llm.kv_truncate(n_keep)  # a KV cache, or within the snapshots' reach
            return
        t = time.perf_counter()
        start = self._saved_at
        replay = list(batch[: n_keep - start])
        if self.corrupt:
            self.corrupt -= 1
            replay = list(batch[1 : n_keep - start + 1])  # the first rejected token replaces the last kept one
        self._ckpt.restore(self.llm)
        self.llm.kv_truncate(start)  # the attention tail; the recurrent part is already there
        self.llm.decode(replay, start, logits=None)
        self._saved_at = -1
        self.ms += (time.perf_counter() - t) * 1e3

    def take_ms(self) -> float:
        ms, self.ms = self.ms, 0.0
        return ms
