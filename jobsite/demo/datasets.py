"""The demo's datasets (the dataset registry imports every installed app's datasets.py)."""

from . import data  # noqa: F401  declares demo.events, demo.rollup, demo.analytics (+ region_events, weekly_rollup)
