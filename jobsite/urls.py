"""URL map: the admin is the product's main screen (its landing page is the queue overview); /metrics and
/healthz are for machines; /events/<source>/ takes signed workflow events (workflows/inbound.py)."""

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from queue_app import monitoring
from queue_app.workflows import inbound

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
    path("events/<str:source>/", inbound.receive_event, name="workflow-events"),
]
