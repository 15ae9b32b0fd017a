"""Link rates as tc writes them ("100mbit", "1gbit"), and "unshaped" for no limit."""

from __future__ import annotations

import re

_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_RATE = re.compile(r"^([0-9]*\.?[0-9]+)(bit|kbit|mbit|gbit)$")


def parse_rate(rate: str | None) -> float | None:
    """Bits per second of a rate ("100mbit", "1gbit", "2.5gbit"); None for "unshaped" or None."""
    if rate is None or str(rate).strip().lower() == "unshaped":
        return None
    m = _RATE.match(str(rate).strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"bad link rate {rate!r}: expected e.g. 100mbit, 1gbit or unshaped")
    return float(m.group(1)) * _UNITS[m.group(2)]


def rate_label(rate: str | None) -> str:
    """ "unshaped", or the rate in lower case as given ("1gbit")."""
    return "unshaped" if parse_rate(rate) is None else str(rate).strip().lower()
