"""A wait in words, as a person says it ("in 23 h 56 min", never "in 86197 s"): for a refusal and a page.

It only writes; when a count resets is the caller's to know.
"""

from __future__ import annotations


def in_words(seconds: float) -> str:
    """A wait as a person says it: "45 s", "12 min", "23 h 56 min", "3 days 4 h"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = -(-seconds // 60)  # a started minute counts: "in 1 min", never "in 0 min"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} days {hours} h" if hours else f"{days} days"
