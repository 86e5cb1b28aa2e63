"""A target's multi-token-prediction (MTP, "NextN") head, read from its GGUF header.

`{arch}.nextn_predict_layers = N` says the last N blocks of `block_count` are draft heads
(llama.cpp's LLM_KV_NEXTN_PREDICT_LAYERS); a converter run with `--no-mtp` drops the key
and the tensors, and a GGUF may keep the key without them. llama.cpp itself decides a
GGUF has a head from the tensor `blk.{block_count-1}.nextn.eh_proj.weight`
(common/speculative.cpp), so a head counts only when that tensor is there.

What a drafted token costs, before any is measured: decoding on a CPU reads the weights,
so the head's bytes per token (its blocks and the output head it runs for each token;
the token embedding is one row) over the target's per step (the trunk and the output
head) predict its cost relative to a target step, as a draft model's file size does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdash.models.gguf_header import GGUFHeader, read_gguf_header

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class MtpHead:
    layers: int  # heads present (declared, with their tensors); 0: none
    declared: int  # nextn_predict_layers as written
    head_bytes: int = 0  # read per drafted token: the head blocks + the output head
    step_bytes: int = 0  # read per target step: the trunk + the output head

    @property
    def relative_cost(self) -> float | None:
        """A drafted token's predicted cost relative to one target step; None without a head."""
        if not self.layers or not self.step_bytes:
            return None
        return self.head_bytes / self.step_bytes

    def describe(self) -> str:
        """What check / models scan / models pairs print: "" without a head."""
        if self.layers:
            return f"MTP head: {self.layers} layer{'s' * (self.layers != 1)}"
        if self.declared:
            return (f"MTP head: declared ({self.declared} layer(s)) but its tensors are missing "
                    "(a GGUF converted without the head?)")
        return ""


def mtp_head_of(header: GGUFHeader) -> MtpHead:
    meta = header.metadata
    arch = meta.get("general.architecture")
    declared = meta.get(f"{arch}.nextn_predict_layers") if isinstance(arch, str) else None
    blocks = meta.get(f"{arch}.block_count") if isinstance(arch, str) else None
    if not isinstance(declared, int) or declared <= 0 or not isinstance(blocks, int):
        return MtpHead(0, 0)
    names = {t.name for t in header.tensors}
    if f"blk.{blocks - 1}.nextn.eh_proj.weight" not in names:
        return MtpHead(0, declared)
    first_head = blocks - declared
    head = trunk = out = 0
    for t in header.tensors:
        size = t.nbytes() or 0
        m = _BLOCK.match(t.name)
        if m is None:
            if t.name == "output.weight":
                out = size
            elif t.name == "token_embd.weight" and not out:
                out = -size  # tied: the embedding is the output head (unless output.weight shows up)
            continue
        if int(m.group(1)) >= first_head:
            if not t.name.endswith("nextn.embed_tokens.weight"):  # one row per token
                head += size
        else:
            trunk += size
    out = abs(out)
    # A head with its own output projection (nextn.shared_head_head) does not run the target's.
    own = any(t.name.endswith("nextn.shared_head_head.weight") for t in header.tensors)
    return MtpHead(declared, declared, head + (0 if own else out), trunk + out)


def mtp_head(path: str | Path) -> MtpHead:
    """The head of the GGUF at `path` (its header only); GGUFError if unreadable."""
    return mtp_head_of(read_gguf_header(path))
