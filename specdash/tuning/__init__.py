"""Tuning work on top of the sources: schedules, sweeps, bench, what-if, the built-in prompts and llama.cpp's own tools as peers."""
