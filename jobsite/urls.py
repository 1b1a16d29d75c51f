"""URL map: the admin is the product's main screen (its landing page is the queue overview); /metrics and
/healthz are for machines."""

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from queue_app import monitoring

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("metrics", monitoring.metrics, name="metrics"),
    path("healthz", monitoring.healthz, name="healthz"),
]
