"""Datasets the dataset CLI tests declare in their child processes (`manage.py dataset --import
tests.tasks.datasets_declared`): paths are under the root the test passes in JOBSITE_DATASET_ROOTS."""

import datetime as dt

from queue_app.datasets import Freshness, StaticPartitions, dataset

dataset(
    "events",
    location="events/day={partition}",
    partitioning="daily",
    owner="data-eng",
    description="raw events, one directory per day",
    freshness=Freshness(partition_by="06:00"),
)
dataset("rollup", location="rollup", freshness=Freshness(max_age=dt.timedelta(hours=26)))
dataset("regions", location="regions/{partition}", partitioning=StaticPartitions(["eu", "us"]))
dataset("clicks_hourly", location="table:analytics.clicks_hourly", partitioning="hourly")
