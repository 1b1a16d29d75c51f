"""URL map: the admin is the product's main screen (its landing page is the queue overview); /metrics, /healthz
and /events/<source>/ are jobsite's URLs for machines, one include (queue_app/urls.py)."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("", include("queue_app.urls")),
]
