"""A helper package the letter_stats example imports: shipped to the driver and the executors with
spark-submit --py-files (as a zip of this directory), never installed."""

import re

_WORD = re.compile(r"[a-z]+")


def words(line):
    """The lower-case words of a line."""
    return _WORD.findall(line.lower())


def kind(word):
    """'short' (up to 3 letters) or 'long'."""
    return "short" if len(word) <= 3 else "long"
