"""Django forms built from a Spark job's declared parameters (registry.Param), for the dashboard's trigger page.

Each Param becomes a typed field (number, date, checkbox, choice, text) with its default as the initial value;
the job's own `validate()` stays the authority: the form runs it in `clean()` and shows each of its errors on
the field it names, so the form and `trigger_run()` can never disagree about what is valid.
"""

from __future__ import annotations

from typing import Any

from django import forms

from .registry import Param, SparkJob, SparkParamError
from .runs import MAX_RUN_TIMEOUT, check_timeout


def param_field(param: Param) -> forms.Field:
    """The form field of one declared parameter."""
    common: dict[str, Any] = {
        "required": param.required,
        "help_text": param.help,
        "initial": param.default,
        "label": param.name,
    }
    if param.type == "int":
        return forms.IntegerField(min_value=param.min, max_value=param.max, **common)
    if param.type == "float":
        return forms.FloatField(min_value=param.min, max_value=param.max, **common)
    if param.type == "bool":
        return forms.BooleanField(**{**common, "required": False})
    if param.type == "date":
        return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **common)
    if param.type == "choice":
        choices = [(c, c) for c in param.choices]
        if not param.required:
            choices = [("", "---------"), *choices] if param.default is None else choices
        return forms.ChoiceField(choices=choices, **common)
    return forms.CharField(strip=param.type == "path", **common)  # str and path


class SparkRunForm(forms.Form):
    """Parameters of one job (prefixed with the job's name, so every job's form fits on one page), plus the
    run's timeout."""

    def __init__(self, spark_job: SparkJob, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", spark_job.name)
        super().__init__(*args, **kwargs)
        self.spark_job = spark_job
        for param in spark_job.params:
            self.fields[param.name] = param_field(param)
        self.fields["timeout"] = forms.FloatField(
            required=False,
            min_value=0.001,
            max_value=MAX_RUN_TIMEOUT,
            label="timeout (s)",
            help_text=f"Stop the run after this many seconds (default and most: {MAX_RUN_TIMEOUT:g}).",
        )

    def params(self) -> dict[str, Any]:
        """The raw parameters as the form cleaned them (None for empty optional fields)."""
        return {p.name: self.cleaned_data.get(p.name) for p in self.spark_job.params}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            self.spark_job.validate(self.params())
            check_timeout(self.spark_job.name, cleaned.get("timeout"))
        except SparkParamError as exc:
            self.add_param_errors(exc)
        return cleaned

    def add_param_errors(self, exc: SparkParamError) -> None:
        for name, message in exc.errors.items():
            self.add_error(name if name in self.fields else None, message)
