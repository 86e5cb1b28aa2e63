"""Built-in prompts: the bench's default set and the dashboard's workload.

Mixed on purpose. Grounded prompts (an edit of given code, a summary of a given text, an
extraction from a given record) repeat their input, which free drafters (prompt lookup,
suffix) can copy; open generation (new code, prose) only a draft model can predict.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    name: str
    kind: str  # code | edit | summary | json | prose
    text: str


_INVENTORY = '''def load_inventory(path):
    items = {}
    with open(path) as f:
        for line in f:
            name, qty, price = line.strip().split(",")
            items[name] = {"qty": int(qty), "price": float(price)}
    return items


def total_value(items):
    total = 0
    for name in items:
        total = total + items[name]["qty"] * items[name]["price"]
    return total


def restock(items, name, amount):
    if name not in items:
        items[name] = {"qty": 0, "price": 0.0}
    items[name]["qty"] = items[name]["qty"] + amount
    return items
'''

_ARTICLE = """The city council met on Tuesday evening to debate the proposed changes to the
downtown parking rules. Under the plan, metered parking on Main Street and the three
streets around the central market would run until 9 p.m. instead of 6 p.m., and the hourly
rate would rise from $1.50 to $2.25. Supporters, including the downtown business
association, argued that longer meter hours would increase turnover in the evening, when
restaurants and the theatre draw the most visitors, and that the extra revenue, estimated
at $410,000 a year, would pay for new lighting and two additional bus routes. Opponents,
among them several residents of the market district, said the change would push
evening visitors into residential side streets and hurt workers on late shifts who already
struggle to find affordable parking. Council member Ruth Alvarez proposed an amendment
that would give residents of the affected streets free permits and exempt the first
thirty minutes of parking after 6 p.m. After two hours of discussion, the council approved
the plan with the Alvarez amendment by a vote of six to three. The new rules take effect
on the first of March, and the council asked the transport department to report back in
September on parking occupancy, revenue, and complaints from residents."""

_RECORD = """Order #A-20931 was placed on 2024-03-18 by Maria Keller (maria.keller@example.com,
phone +49 30 5550 1234). Shipping address: Lindenstrasse 14, 10969 Berlin, Germany.
Items: 2 x USB-C charging cable (1 m) at 9.99 EUR each; 1 x wireless keyboard, layout
German, at 49.90 EUR; 3 x AA rechargeable battery pack at 12.50 EUR each. Shipping was
express (6.90 EUR). Payment by credit card ending in 4417. The customer asked for the
keyboard to be gift-wrapped and for delivery after 5 pm."""

BUILTIN: tuple[Prompt, ...] = (
    Prompt(
        "code-generation",
        "code",
        "Write a Python function `merge_intervals(intervals)` that merges overlapping "
        "intervals given as a list of (start, end) tuples and returns the merged list sorted "
        "by start. Include a docstring and three doctest examples.",
    ),
    Prompt(
        "code-edit",
        "edit",
        "Add type hints and docstrings to every function in this Python module, and make "
        "total_value use sum() with a generator. Return the whole updated module.\n\n"
        f"```python\n{_INVENTORY}```",
    ),
    Prompt(
        "summarization",
        "summary",
        "Summarize the following news article in one paragraph, keeping every number and "
        f"name that matters.\n\n{_ARTICLE}",
    ),
    Prompt(
        "json-extraction",
        "json",
        "Extract this order as JSON with keys order_id, date, customer {name, email, phone}, "
        "address {street, postcode, city, country}, items [{name, quantity, unit_price_eur}], "
        f"shipping_eur, payment, notes. Output only the JSON.\n\n{_RECORD}",
    ),
    Prompt(
        "prose",
        "prose",
        "Write a short story (about 200 words) about a lighthouse keeper who finds a message "
        "in a bottle written in her own handwriting.",
    ),
)


def by_name(name: str) -> Prompt:
    for p in BUILTIN:
        if p.name == name:
            return p
    raise KeyError(name)
