"""Trace ids are random version-4 UUIDs written as 32 hex digits."""

from __future__ import annotations

import uuid

from rllm_core.gateway.accumulator import new_trace_id


def test_trace_ids_are_uuid4_hex():
    ids = [new_trace_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
