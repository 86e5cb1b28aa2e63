"""specdash: a terminal dashboard with a speculative-decoding engine inside."""

__version__ = "0.1.0"
