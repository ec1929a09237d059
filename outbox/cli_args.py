"""Argument types of the ``outbox`` command: a bad number is a usage error (argparse prints the
usage and the option's message, exit status 2), never a traceback."""

from __future__ import annotations

import argparse
import math


def _number(raw: str, convert: type[int] | type[float]) -> int | float:
    try:
        value = convert(raw)
    except ValueError:
        kind = "a whole number" if convert is int else "a number"
        raise argparse.ArgumentTypeError(f"{raw!r} is not {kind}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number")
    return value


def positive_int(raw: str) -> int:
    value = int(_number(raw, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} must be 1 or more")
    return value


def non_negative_int(raw: str) -> int:
    value = int(_number(raw, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be 0 or more")
    return value


def non_negative_float(raw: str) -> float:
    value = float(_number(raw, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be 0 or more")
    return value


def positive_float(raw: str) -> float:
    value = float(_number(raw, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be more than 0")
    return value


def port(raw: str) -> int:
    value = int(_number(raw, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port (0 to 65535)")
    return value
