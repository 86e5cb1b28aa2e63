"""A real model with a padded vocabulary: SmolLM2-135M rewritten with `extra` tokens
appended to its token list and zero rows appended to its (tied) embedding matrix.

This is the shape of one of the original research's compatibility failures: Qwen2.5's
larger checkpoints pad the vocabulary to 152,064 entries while the small ones have
151,936, with identical texts for every id both have. llama.cpp's rule (size difference
<= 128, identical text from id 5 on) accepts such pairs on the same-vocabulary path.
The padding rows are zero, so the padded ids get logit 0: they exist but are never
trained, as in the real checkpoints. Tensors are copied byte for byte (the GGUF writer
takes the quantized row bytes as they are), so the model is SmolLM2 itself.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TOKENS, TYPES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"


def make_padded(source: Path, out: Path, extra: int = 128) -> Path:
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == TOKENS:
            value = list(value) + [f"<pad_{i}>" for i in range(extra)]
        elif name == TYPES:
            value = list(value) + [gguf.TokenType.UNUSED] * extra
        elif name == f"{arch}.vocab_size":
            value = int(value) + extra
        types = field.types
        sub_type = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, types[0], sub_type=sub_type)
    tensors = []
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name == "token_embd.weight":  # rows are tokens: one zero row per padded id
            data = np.concatenate([data, np.zeros((extra, *data.shape[1:]), dtype=data.dtype)])
        tensors.append((t.name, data, t.tensor_type))
    for name, data, qtype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return out
