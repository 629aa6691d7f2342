"""Array layouts: token ids as low halves then high byte planes, joins and tails of packed
arrays without unpacking, transposed logprobs, and the context tails built from them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_trace_store_deltachain.context import CONTEXT_TOKENS, TailCache, extend_tail
from rllm_trace_store_deltachain.packing import (
    count_ids,
    join_ids,
    pack_floats,
    pack_ids,
    unpack_floats,
    unpack_ids,
)

_ids = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=40)


def test_ids_are_low_halves_side_by_side_then_the_third_and_fourth_bytes():
    # 1 = 01 00 00 00, 258 = 02 01 00 00, 65_537 = 01 00 01 00, -1 = ff ff ff ff
    assert pack_ids([1, 258, 65_537, -1]) == bytes.fromhex("0100 0201 0100 ffff 000001ff 000000ff")
    assert pack_ids([]) == b""


@pytest.mark.parametrize(
    "ids", [[], [0], [2**31 - 1, -(2**31), 0, 151_643, 7], list(range(0, 300_000, 997))]
)
def test_ids_round_trip(ids):
    assert unpack_ids(pack_ids(ids)) == ids
    assert count_ids(pack_ids(ids)) == len(ids)


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1, 10**12])
def test_ids_outside_int32_name_the_value(bad):
    with pytest.raises(ValueError, match=str(bad)):
        pack_ids([1, bad, 2])


def test_an_id_that_is_not_an_integer_is_a_type_error():
    with pytest.raises(TypeError, match=r"token ids are integers, got 1\.5"):
        pack_ids([1, 1.5])  # type: ignore[list-item]


def test_a_packed_array_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="4 bytes each, got 6 bytes"):
        unpack_ids(b"\x00" * 6)


@given(parts=st.lists(_ids, max_size=4), last=st.none() | st.integers(0, 100))
def test_join_equals_packing_the_concatenation(parts, last):
    whole = [token for part in parts for token in part]
    expected = whole if last is None else whole[max(0, len(whole) - last) :]
    assert join_ids([pack_ids(part) for part in parts], last=last) == pack_ids(expected)


def test_a_repeated_sequence_stays_one_run_of_bytes():
    sequence = [15_000, 301, 42, 49_151]
    packed = pack_ids([7, *sequence, 9, *sequence])
    low_halves = packed[: 2 * 10]
    assert low_halves.count(pack_ids(sequence)[:8]) == 2


def test_float32_logprobs_take_four_planes_with_signs_and_exponents_last():
    packed, width = pack_floats([-0.5, -2.0])
    # -0.5 = 0xbf000000 and -2.0 = 0xc0000000, little-endian, byte-transposed
    assert (packed, width) == (bytes.fromhex("0000 0000 0000 bfc0"), 4)
    assert unpack_floats(packed, width) == [-0.5, -2.0]


def test_floats_that_float32_would_change_take_eight_bytes():
    packed, width = pack_floats([-0.1])
    assert width == 8 and len(packed) == 8
    assert unpack_floats(packed, width) == [-0.1]


def test_unpacking_floats_checks_the_width():
    with pytest.raises(ValueError, match="not floats of width 3"):
        unpack_floats(b"\x00" * 6, 3)


def test_a_tail_keeps_the_last_context_tokens():
    first = list(range(CONTEXT_TOKENS - 10))
    tail = extend_tail(None, pack_ids(first))
    assert unpack_ids(tail) == first
    tail = extend_tail(tail, pack_ids([-1] * 25), pack_ids([-2] * 5))
    assert unpack_ids(tail) == first[20:] + [-1] * 25 + [-2] * 5
    assert count_ids(tail) == CONTEXT_TOKENS
    long = list(range(CONTEXT_TOKENS + 3))
    assert unpack_ids(extend_tail(tail, pack_ids(long))) == long[3:]


def test_the_tail_cache_drops_the_least_recently_used_over_its_budget():
    cache = TailCache(max_tokens=10)
    cache.put("a", pack_ids([1] * 4))
    cache.put("b", pack_ids([2] * 4))
    assert cache.get("a") == pack_ids([1] * 4)  # now "b" is the least recently used
    cache.put("c", pack_ids([3] * 4))
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (
        pack_ids([1] * 4),
        None,
        pack_ids([3] * 4),
    )
    cache.put("a", pack_ids([4] * 2))  # replacing an entry counts its new size only
    cache.put("d", pack_ids([5] * 4))
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.get("c") is None
