"""The jobsite project's own app: what belongs to this project and not to the apps an adopter installs.

Its management commands (`up`, `test`, `embedded_db`, and the tooling's `queue_bench`, `queue_chaos`,
`spark_bench`, `webhook_bench`, `admin_bench`) and the admin's branding. An adopter's project installs
`queue_app` (and the layers it wants) and never this app, so it keeps Django's `test` and its own admin titles.
"""

from django.apps import AppConfig


class JobsiteProjectConfig(AppConfig):
    name = "jobsite"
    label = "jobsite_project"
    verbose_name = "jobsite (the project)"

    def ready(self) -> None:
        from django.contrib import admin

        # The project's choice, not the app's: the admin is this project's main screen, its home the overview
        # (templates/admin/index.html).
        admin.site.site_header = "jobsite"
        admin.site.site_title = "jobsite admin"
        admin.site.index_title = "Queue overview"
