"""Limits the event contract shares with the engine, at the bottom of the import graph:
the contract (events.py) refuses a recording or a server reading beyond them, and the
engine's settings table (engine/settings.py) takes its ranges from them, so the two
cannot disagree and the contract needs nothing of the engine."""

# The longest draft: K, and so the per-position series, never run past it. A target batch
# of K+1 must fit n_batch (512); beyond ~32 nothing pays on a CPU, but a GPU box verifying
# 24-48 tokens is the research's headline case, so the cap is wide.
K_CAP = 64
