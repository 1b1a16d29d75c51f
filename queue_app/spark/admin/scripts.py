"""Existing PySpark scripts registered from the admin (SparkScript): a user with the model's add/change
permission declares the path (under the allowed roots), arguments, params, conf, env, resources and the datasets
it produces and consumes; every field
is checked (queue_app/spark/scripts.py check_stored) and the row is written by scripts.save_script, never here.
Django's add/change/delete permissions and the admin log apply as for any model."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import ActionLocation
from django.http import HttpRequest
from django.utils.html import format_html

from queue_app.spark.models import SparkScript
from queue_app.spark.scripts import allowed_roots, check_stored, delete_script, save_script

# What a blank JSON field of the form stands for.
BLANK = {"py_files": [], "args": [], "params": [], "conf": {}, "env": {}, "policy": {}, "produces": {}, "consumes": {}}


class SparkScriptForm(forms.ModelForm):
    class Meta:
        model = SparkScript
        fields = (
            "name",
            "description",
            "enabled",
            "path",
            "args",
            "params",
            "py_files",
            "conf",
            "env",
            "driver_memory",
            "executor_memory",
            "driver_cores",
            "executor_cores",
            "policy",
            "produces",
            "consumes",
        )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        for name, empty in BLANK.items():
            if cleaned.get(name) is None:  # a blank JSON field
                cleaned[name] = empty
        row = self.instance
        for name, value in cleaned.items():
            setattr(row, name, value)
        for name, message in check_stored(row).items():
            self.add_error(name if name in self.fields else None, message)
        return cleaned


@admin.register(SparkScript)
class SparkScriptAdmin(admin.ModelAdmin):
    form = SparkScriptForm
    list_display = ("name", "path", "enabled", "updated_at", "updated_by")
    list_filter = ("enabled",)
    search_fields = ("=name",)
    readonly_fields = ("roots", "updated_at", "updated_by")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "path", "roots")}),
        ("Arguments", {"fields": ("args", "params")}),
        (
            "Spark",
            {
                "fields": (
                    "py_files",
                    "conf",
                    "env",
                    "driver_memory",
                    "executor_memory",
                    "driver_cores",
                    "executor_cores",
                )
            },
        ),
        ("Policy", {"fields": ("policy",)}),
        ("Datasets", {"fields": ("produces", "consumes")}),
        ("Changes", {"fields": ("updated_at", "updated_by")}),
    )

    @admin.display(description="Allowed roots")
    def roots(self, obj: SparkScript | None = None) -> str:
        roots = allowed_roots()
        if not roots:
            return format_html("<strong>{}</strong>", "none: set JOBSITE_SPARK_SCRIPT_ROOTS")
        return ", ".join(roots)

    def get_actions(self, request: HttpRequest, action_location: Any = ActionLocation.CHANGE_LIST) -> dict[str, Any]:
        # One script at a time, from its page (delete_sparkscript, a confirmation page): no bulk delete.
        actions = super().get_actions(request, action_location)
        actions.pop("delete_selected", None)
        return actions

    def save_model(self, request: HttpRequest, obj: SparkScript, form: Any, change: bool) -> None:
        save_script(obj, actor=request.user.get_username())

    def delete_model(self, request: HttpRequest, obj: SparkScript) -> None:
        delete_script(obj, actor=request.user.get_username())
