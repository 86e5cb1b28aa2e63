"""Watching a run: the health rules, a row per request, plain decoding's rate, the Prometheus series and remote servers' client."""
