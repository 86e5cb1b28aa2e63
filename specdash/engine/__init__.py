"""The speculative-decoding engine. No Textual imports here: usable headless and in tests."""
