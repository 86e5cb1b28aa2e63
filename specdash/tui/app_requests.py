"""`l`: the requests table (tui/screens/requests.py) over the state's request log. A mixin
of SpecdashApp (tui/app.py)."""

from __future__ import annotations

from textual.binding import Binding

from specdash.tui.app_base import DashboardBase
from specdash.tui.screens.requests import RequestsScreen


class RequestsView(DashboardBase):
    BINDINGS = [Binding("l", "requests", "requests", show=False, id="app.requests")]

    def action_requests(self) -> None:
        if isinstance(self.screen, RequestsScreen):
            self.screen.dismiss()
            return
        self.push_screen(RequestsScreen(self.state))
