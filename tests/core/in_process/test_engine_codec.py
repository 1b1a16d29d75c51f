"""The hot path's own encodings, through the real server: id and result arrays sent in PostgreSQL's binary array
format (engine/db.py: Int8Array, JsonbArray) and payloads decoded by orjson with json.loads where orjson would
lose digits (engine/payload.py). Each must give exactly what the plain ways give."""

import json

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_app import engine
from queue_app.engine.db import Int8Array, JsonbArray, cursor
from queue_app.engine.payload import decode_json, encode_json

pytestmark = pytest.mark.django_db

INT8 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)  # beyond 64 bits too: jsonb keeps them exactly
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,  # jsonb stores no NUL and no lone surrogate
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def roundtrip(sql: str, value) -> list:
    with cursor() as cur:  # the prepared, server-side-bound cursor of the engine: binary parameters
        cur.execute(sql, {"v": value})
        (got,) = cur.fetchone()
    with connection.cursor() as cur:  # Django's own client-side cursor: the same value as a text literal
        cur.execute(sql.replace("%(v)s", "%s"), [value])
        (as_literal,) = cur.fetchone()
    assert got == as_literal
    return got


@FEW
@given(st.lists(INT8, max_size=300))
def test_int8_arrays_reach_the_server_exactly(ids):
    assert roundtrip("SELECT %(v)s::bigint[]", Int8Array(ids)) == ids


@pytest.mark.parametrize("ids", [[], [0], [2**63 - 1, -(2**63)], list(range(10**12, 10**12 + 2_000))])
def test_int8_array_edges(ids):
    assert roundtrip("SELECT %(v)s::bigint[]", Int8Array(ids)) == ids
    assert roundtrip("SELECT cardinality(%(v)s::bigint[])", Int8Array(ids)) == len(ids)


def test_an_id_beyond_64_bits_is_refused_before_anything_is_sent():
    with pytest.raises(OverflowError), cursor() as cur:
        cur.execute("SELECT %(v)s::bigint[]", {"v": Int8Array([1, 2**63])})


@FEW
@given(st.lists(st.none() | JSON, max_size=20))
def test_jsonb_arrays_reach_the_server_exactly(values):
    texts = [None if v is None else encode_json(v, "result") for v in values]
    got = roundtrip("SELECT %(v)s::jsonb[]", JsonbArray(texts))  # binary and text literal: the same documents
    assert len(got) == len(texts)
    assert [t is None for t in got] == [t is None for t in texts]


def test_jsonb_array_of_nulls_and_of_nothing():
    assert roundtrip("SELECT %(v)s::jsonb[]", JsonbArray([None] * 1_000)) == [None] * 1_000
    assert roundtrip("SELECT %(v)s::jsonb[]", JsonbArray([])) == []


@FEW
@given(JSON)
def test_a_payload_decodes_as_json_loads_would_after_jsonb(value):
    """Stored as jsonb and read back as text (the server's own printing of numbers), decode_json gives what
    json.loads gives: the same values and the same types (an integer beyond 64 bits stays an exact int)."""
    with connection.cursor() as cur:
        cur.execute("SELECT %s::jsonb::text", [encode_json(value)])
        (text,) = cur.fetchone()
    decoded, expected = decode_json(text), json.loads(text)
    assert decoded == expected
    assert json.dumps(decoded) == json.dumps(expected)  # same types all the way down (1 vs 1.0, int vs float)


def test_big_integers_in_a_leased_payload_keep_every_digit():
    payload = {"id": 123456789012345678901234567890, "neg": -9223372036854775809, "f": 0.1}
    engine.enqueue("t", payload)
    (lease,) = engine.lease(["default"], 1, "w1", lease_timeout=60)
    assert lease.payload == payload
    assert isinstance(lease.payload["id"], int)
