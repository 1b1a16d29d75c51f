"""The schedule admin form's POST data (its fields and an empty inline formset), for the tests that post it."""

FORM_FIELDS = {
    "name": "nightly",
    "enabled": "on",
    "cron": "0 3 * * *",
    "timezone": "UTC",
    "catch_up": "skip",
    "target_kind": "task",
    "target": "queue_app.noop",
    "payload": "{}",
    "dedup_window": "",
}


def post_data(**overrides) -> dict[str, str]:
    data = {
        **FORM_FIELDS,
        "fires-TOTAL_FORMS": "0",
        "fires-INITIAL_FORMS": "0",
        "fires-MIN_NUM_FORMS": "0",
        "fires-MAX_NUM_FORMS": "0",
    }
    data.update(overrides)
    return data
