"""jobsite's URLs for machines, as one `include()`: `/metrics` (Prometheus), `/healthz` and `/events/<source>/`
(signed workflow events, workflows/inbound.py).

    urlpatterns = [..., path("jobsite/", include("queue_app.urls"))]

The admin's pages come with the admin site (`admin.site.urls`), nothing to add for them.
"""

from django.urls import path

from . import monitoring
from .workflows import inbound

app_name = "jobsite"

urlpatterns = [
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    path("events/<str:source>/", inbound.receive_event, name="workflow-events"),
]
