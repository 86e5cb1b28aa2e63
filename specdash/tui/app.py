"""The dashboard app: the core (app_base.py: the event path, availability, the source's
lifecycle) with its keys (app_controls.py: steering the source; app_tuning.py: sweep,
export, screenshots, settings files). Import SpecdashApp and DashboardOptions from here."""

from __future__ import annotations

from specdash.tui.app_base import DashboardBase, DashboardOptions, SourceUpdate
from specdash.tui.app_controls import SourceControls
from specdash.tui.app_requests import RequestsView
from specdash.tui.app_tuning import TuningActions, counters_dict


class SpecdashApp(SourceControls, TuningActions, RequestsView, DashboardBase):
    """The live dashboard on any source: the embedded engine, a recording, a server."""


__all__ = ["DashboardOptions", "SourceUpdate", "SpecdashApp", "counters_dict"]
