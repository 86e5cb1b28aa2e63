"""`specdash whatif`: every drafter and K from one plain greedy run, on any machine's
cost curve (no Textual here; the command and the dashboard both use it).

Under greedy decoding the text is the same whatever drafts it, so a sweep can be
computed instead of run: model-free drafters are replayed over the known text
(simulate.py), a draft model's proposals come from one teacher-forced pass
(transcript.py), and each simulated step's time comes from a cost profile (profile.py).
The adaptive controller is the engine's own, fed the simulated steps in order.
Without a text, synthetic.py prices an acceptance figure (llama.cpp's synthetic
acceptance length or rates) on the same profile for every K.
"""
