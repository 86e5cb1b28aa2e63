"""Several requests in one target batch (a server's `--parallel N`, issue 41).

Each request is a sequence of its own in the target's context (engine/llm.py, `n_seq`),
with its own drafter, sampling stream, verify and rollback (slot.py). Every step, one
`llama_decode` carries every active request's last token and the draft verified after it
(runner.py). Which K each request verifies is chosen for the whole batch (plan.py): the
most expected accepted tokens per millisecond of the batch, priced on what batches of
that many tokens and sequences have cost here (costs.py), K = 0 included, so a request
with a good copy may verify 16 while another decodes plain.

Why copies only: a draft model has one context, and drafting N sequences would need a
draft context per sequence or a multi-sequence draft model (llama-server's slots each keep
their own). On the 2-core machines this project runs on, a draft model's verify already
costs most of what it saves with one client (benchmarks/results/serve-vs-llamaserver-
kept.txt: llama-server with a draft model ran 0.4-0.6x plain), so batching it would not
pay; model-free copies cost nothing to propose and are what pays under load.
"""
