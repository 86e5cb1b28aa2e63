"""Textual's Footer without its leak on every rebuild.

The Footer rebuilds its FooterKey widgets whenever bindings change (a screen opens or
closes, an action becomes available or not), and each FooterKey calls
`data_bind(compact=Footer.compact)`, which stores a (key, callback) pair in the Footer's
watcher list. Textual prunes that list only when `compact` changes, which in a dashboard
it never does: every removed FooterKey (with its styles, message queue and caches, ~6 kB)
stays reachable for the life of the app (textual#6666, open in Textual 8.2). Over a
30-minute soak that was ~4 keys a second, most of the Python heap's growth.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer


class KeyFooter(Footer):
    """A Footer that drops the watchers of the keys it has removed before building new ones."""

    def compose(self) -> ComposeResult:
        # "__watchers" is set with setattr by textual.reactive._watch: not name-mangled.
        watchers: dict[str, list] = getattr(self, "__watchers", {})
        for entries in watchers.values():
            entries[:] = [(node, cb) for node, cb in entries if not (node._closing or node._closed)]
        yield from super().compose()

    def watcher_count(self) -> int:
        """How many watchers this footer holds (the leak's size; tests read it)."""
        return sum(len(v) for v in getattr(self, "__watchers", {}).values())
