"""`python -m jobsite.bench.admin_probe N`: GET the QueueItem change list N times as a superuser, in a process
of its own (as a web worker would be), and print the timings as one JSON line. Run by jobsite_side.py with the
environment pointing at the bench's scratch database."""

import json
import sys
import time
from collections import Counter


def main(requests: int) -> dict:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.test import Client, override_settings
    from django.urls import reverse

    from queue_app.models import QueueItem

    if not admin.site.is_registered(QueueItem):
        return {"error": "QueueItem is not registered in the admin"}
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    # DEBUG is off (as deployed) but nobody ran collectstatic for this scratch run: link static files by name.
    plain = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    storages = {**settings.STORAGES, "staticfiles": plain}
    override_settings(STORAGES=storages).enable()
    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:queue_app_queueitem_changelist")
    client.get(url)  # warm: templates loaded, first queries planned
    times: list[float] = []
    statuses: Counter[str] = Counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        statuses[str(response.status_code)] += 1
    ordered = sorted(times)
    return {
        "p50_ms": round(ordered[len(ordered) // 2], 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 2),
        "max_ms": round(ordered[-1], 2),
        "requests": requests,
        "statuses": dict(statuses),
        "rows": QueueItem.objects.count(),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
