"""llama.cpp's log, for the model tools (compat, quantize): the engine's one hook."""

from specdash.engine.llamalog import captured_llama_log, last_lines

__all__ = ["captured_llama_log", "last_lines"]
