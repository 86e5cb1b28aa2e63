"""Repetition penalties (engine/penalties.py) as llama.cpp's penalties sampler defines them,
row by row of a verify batch (the served exactness test: tests/test_serve.py)."""

from __future__ import annotations

import numpy as np

from specdash.engine.penalties import Penalties, penalized


def test_a_seen_token_is_penalized_as_llama_cpp_does_and_each_row_sees_the_draft_before_it():
    rows = np.array([[2.0, -2.0, 1.0, 0.5]] * 3, dtype=np.float32)
    p = Penalties(repeat=2.0, frequency=0.25, presence=0.5, last_n=3)
    out = penalized(rows, context=[0, 0, 1], draft=[2, 3], p=p)
    # Row 0, window [0, 0, 1]: token 0 twice (2/2 - 2*.25 - .5), token 1 once (-2*2 - .25 - .5).
    assert np.allclose(out[0], [0.0, -4.75, 1.0, 0.5])
    # Row 1, window [0, 1, 2] (the first draft token joins, the oldest leaves).
    assert np.allclose(out[1], [2 / 2 - 0.25 - 0.5, -4.75, 1 / 2 - 0.25 - 0.5, 0.5])
    # Row 2, window [1, 2, 3].
    assert np.allclose(out[2], [2.0, -4.75, -0.25, 0.5 / 2 - 0.25 - 0.5])
    assert penalized(rows, [0], [], Penalties()) is rows  # nothing asked: the same rows, no copy
