"""A fleet with servers that misbehave, in the real dashboard (Pilot): a server that stalls
or answers garbage is marked in its row, never waited on; the others' rows keep moving;
polls never pile up (at most one request in flight per server, no more polls than the
interval allows). Not timed: benchmarks/fleet_scale.py measures 100 servers for 10
minutes (key to screen, memory, CPU)."""

from __future__ import annotations

import asyncio
import time

from fake_fleet import FakeFleet
from specdash.sources.remote import RemoteSource
from specdash.tui.fleet_app import FleetDashboard

INTERVAL = 0.25
READ_TIMEOUT = 0.6


def test_stalled_and_garbage_servers_are_marked_and_polls_do_not_pile_up() -> None:
    async def body() -> None:
        with FakeFleet(16, stall=2, nan=2, junk=2) as fleet:
            sources = [RemoteSource(url, interval=INTERVAL, read_timeout=READ_TIMEOUT) for url in fleet.urls]
            # Upper bounds count from before the app starts, where its polls can begin (at
            # mount, before run_test returns): CI read a stalled server's 5th request 2.23 s
            # after t0, within 0.6 s timeouts since the polling began.
            t_before = time.monotonic()
            app = FleetDashboard(sources)
            async with app.run_test(size=(180, 30)) as pilot:
                screen = app.fleet
                t0 = time.monotonic()
                rows = screen.servers
                for _ in range(200):
                    await pilot.pause(0.05)
                    if len(rows) == 16 and all(rows[s.url].state != "starting" for s in fleet.servers) and \
                            rows[fleet.servers[0].url].state == "down":
                        break
                marked_after = time.monotonic() - t0
                await pilot.pause(2.0)  # polls go on meanwhile
                elapsed = time.monotonic() - t0
                polling = time.monotonic() - t_before
                screen.flush()
                await pilot.pause()
                by_kind = {kind: [s for s in fleet.servers if s.kind == kind] for kind in ("stall", "nan", "junk", "ok")}
                for s in by_kind["stall"]:
                    assert rows[s.url].state == "down", rows[s.url]
                    assert f"no answer within {READ_TIMEOUT:g}s" in rows[s.url].error
                    assert "down · " in str(screen.table.get_cell(s.url, "status"))
                for s in by_kind["nan"]:
                    assert rows[s.url].state == "bad" and "bad reading" in rows[s.url].error, rows[s.url]
                for s in by_kind["junk"]:
                    assert rows[s.url].state == "down" and "/metrics" in rows[s.url].error, rows[s.url]
                for s in by_kind["ok"]:
                    row = rows[s.url]
                    assert row.state == "up" and row.generation_tokens_per_s is not None, row
                    assert 20 < row.generation_tokens_per_s < 40  # 30 tok/s, over the window
                    # Not held up by the stalled ones: polled about every INTERVAL throughout.
                    assert s.polls >= 0.6 * elapsed / INTERVAL, (s.polls, elapsed)
                # Never more than one request in flight per server, and no more polls than the
                # interval allows (a poll starts INTERVAL after the last one started). The
                # servers' counts and `elapsed` are read at slightly different moments: a
                # poll landing between them is not a pile-up (CI read 12 polls in 2.4996 s).
                for s in fleet.servers:
                    assert s.max_in_flight == 1, (s.kind, s.max_in_flight)
                    assert s.polls <= polling / INTERVAL + 3, (s.kind, s.polls, polling)
                # A stalled server costs its own poller a read timeout per poll, no more.
                for s in by_kind["stall"]:
                    assert s.requests <= polling / READ_TIMEOUT + 1, (s.requests, polling)
                assert marked_after < 10 * READ_TIMEOUT
                # Sorting by status puts the marked ones together at the end.
                screen.sort_by("status")
                await pilot.pause()
                assert set(screen.order[-6:]) == {s.url for k in ("stall", "nan", "junk") for s in by_kind[k]}

    asyncio.run(body())
