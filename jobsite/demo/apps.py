from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "jobsite.demo"
    label = "jobsite_demo"
    verbose_name = "jobsite demo"
