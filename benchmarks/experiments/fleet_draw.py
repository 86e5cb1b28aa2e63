#!/usr/bin/env python
"""The fleet table's own drawing, in-process: 100 servers at 200x50, a sort and its draw,
and an update of every row and its draw, 20 rounds (`--profile` adds cProfile of the sorts).

    python benchmarks/experiments/fleet_draw.py [--profile]

Issue 42: DataTable as it is, sort+draw 46.1 ms median and update+draw 63.3 ms (stop 46);
cells cached by text 24.3 and 33.8 (stop 46); rows cached by version and styles read once
per pass 10.6 and 22.0 ms (stop 48), on a 2-core AMD EPYC (Zen 4).
"""

import asyncio
import cProfile
import pstats
import random
import statistics
import sys
import time

from textual.app import App
from textual.geometry import Region
from specdash.contract.events import ServerEvent
from specdash.tui.screens.fleet import FleetScreen

N = 100
def ev(i, t):
    r = random.Random(i * 1000 + int(t))
    return ServerEvent(url=f"http://127.0.0.1:{40000+i}", state="up", backend="vllm", model="fake/model",
                       requests_running=1, requests_waiting=r.randint(0, 3), generation_tokens_per_s=30 + r.random(),
                       prompt_tokens_per_s=5 + r.random(), acceptance_rate=0.5 + r.random() / 10,
                       mean_accepted_length=3 + r.random(), tokens_per_step=3.7 + r.random() / 10,
                       uptime_s=600 + t, health="healthy", last_seen=time.time(), t=t)

class A(App):
    def on_mount(self):
        self.fleet = FleetScreen()
        self.push_screen(self.fleet)

async def main(profile):
    app = A()
    async with app.run_test(size=(200, 50)) as pilot:
        s = app.fleet
        for i in range(N):
            s.update_server(ev(i, 0))
        s.flush()
        await pilot.pause(0.3)
        table = s.table
        press, update = [], []
        pr = cProfile.Profile()
        for rnd in range(20):
            t0 = time.perf_counter()
            if profile: pr.enable()
            s.action_cycle_sort() if rnd % 2 else s.action_reverse_sort()
            table.render_lines(Region(0, 0, table.size.width, table.size.height))
            if profile: pr.disable()
            press.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            for i in range(N):
                s.update_server(ev(i, rnd + 1))
            s.flush()
            table.render_lines(Region(0, 0, table.size.width, table.size.height))
            update.append((time.perf_counter() - t0) * 1000)
            await pilot.pause(0.05)
        print(f"sort+draw ms: median {statistics.median(press):.1f} max {max(press):.1f}")
        print(f"update 100 rows+draw ms: median {statistics.median(update):.1f} max {max(update):.1f}")
        if profile:
            pstats.Stats(pr).sort_stats("cumulative").print_stats(25)

if __name__ == "__main__":
    asyncio.run(main("--profile" in sys.argv))
