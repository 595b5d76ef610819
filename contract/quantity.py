"""Kubernetes resource quantities ("2", "900k", "1Gi", "500m", "1e3"), parsed exactly.

One parser for every program: the API server may write an extended-resource request as "1k"
or "1Ki", and both sides must read the same number from it.
"""

from __future__ import annotations

import re
from fractions import Fraction

_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_EXPONENT = re.compile(r"[+-]?[0-9]{1,3}", re.ASCII)
#: Longer than any quantity Kubernetes accepts (its own limit is 64 characters of number).
MAX_QUANTITY_CHARS = 64


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity, or not one that fits where it was used."""


def parse_quantity(text: str) -> Fraction:
    """A quantity as an exact number; QuantityError when `text` is not one."""
    text = text.strip()
    if not text:
        raise QuantityError("not a quantity: ''")
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"not a quantity: {text[:20]!r}... is {len(text)} characters long")
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return _number(text[: -len(suffix)], text) * factor
    if text.endswith("m"):
        return _number(text[:-1], text) / 1000
    if text[-1] in _DECIMAL:
        return _number(text[:-1], text) * _DECIMAL[text[-1]]
    mantissa, sep, exponent = text.lower().partition("e")
    if sep:
        if not _EXPONENT.fullmatch(exponent):
            raise QuantityError(f"not a quantity: {text!r}")
        return _number(mantissa, text) * Fraction(10) ** int(exponent)
    return _number(text, text)


def whole_quantity(text: str) -> int:
    """A quantity that must be a non-negative whole number (extended resources are)."""
    value = parse_quantity(text)
    if value.denominator != 1 or value < 0:
        raise QuantityError(f"{text.strip()!r} must be a whole, non-negative number")
    return int(value)


def _number(digits: str, whole: str) -> Fraction:
    if not _DECIMAL_NUMBER.fullmatch(digits):
        raise QuantityError(f"not a quantity: {whole!r}")
    return Fraction(digits)
