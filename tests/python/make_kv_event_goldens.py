"""Writes the golden KV event payloads the agent's decoder tests read
(agent/src/kv_index/wire/golden/*.msgpack), encoded by msgspec from vLLM's own struct
definitions (vllm_events.py mirrors vllm/distributed/kv_events.py; the v0.9 structs are below).

The values here are the tests' expected values: agent/src/kv_index/wire/tests.rs restates
them as literals. Change one side, change the other.

The sim_* goldens hold only what the simulator can emit (sim_events below), so the simulator's
own encoder is pinned byte for byte to them: sim/src/events/golden.rs restates those inputs.

    python3 tests/python/make_kv_event_goldens.py
"""

import os
from typing import Optional, Union

import msgspec

import vllm_events as v

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "agent", "src", "kv_index", "wire", "golden"
)

TS = 1718000000.25
BIG = 15760518052499183552  # above i64::MAX: msgpack uint64 (from a live v0.26 capture)
MAX = 2**64 - 1


def kinds(era):
    """vLLM's three event structs of a wire era: stored, removed, all cleared."""
    return {
        "array": (v.ArrayBlockStored, v.ArrayBlockRemoved, v.ArrayAllBlocksCleared),
        "map": (v.MapBlockStored, v.MapBlockRemoved, v.MapAllBlocksCleared),
    }[era]


def events(era, h):
    """The events of the int and bytes goldens; `h(i)` is block hash number i in that form."""
    stored, removed, cleared = kinds(era)
    return [
        # A root run of two blocks on GPU, no LoRA.
        stored(
            block_hashes=[h(0), h(1)],
            parent_block_hash=None,
            token_ids=[101, 102, 103, 104, 105, 106, 107, 108],
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None, None],
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
        # A child block, offloaded to CPU, under a LoRA adapter, with extra keys (a string and
        # an int, as multimodal keys carry offsets).
        stored(
            block_hashes=[h(2)],
            parent_block_hash=h(1),
            token_ids=[109, 110, 111, 112],
            block_size=4,
            lora_id=1,
            medium="CPU",
            lora_name="sql-adapter",
            extra_keys=[("sql-adapter", 7)],
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
        # A sliding-window group of a hybrid model: not a reusable prefix. Map era: no
        # extra_keys (omitted as None).
        stored(
            block_hashes=[h(3)],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=1,
            kv_cache_spec_kind="sliding_window",
            kv_cache_spec_sliding_window=128,
        ),
        removed(block_hashes=[h(1), h(0)], medium="GPU", group_idx=0),
        # No group_idx: omitted in the map era, nil in the array era.
        removed(block_hashes=[h(2)], medium="CPU"),
        cleared(),
    ]


def sim_events(era, h):
    """What the simulator emits, and nothing it cannot: every BlockStored is group 0 of kind
    full_attention with no sliding window and an extra_keys entry per block (a tuple of
    strings, the LoRA name then the cache salt on the first block, or None); every
    BlockRemoved has group_idx 0; hashes are 32-byte digests (or their low 64 bits)."""
    stored, removed, cleared = kinds(era)
    full = dict(group_idx=0, kv_cache_spec_kind="full_attention")
    return [
        # A salted root run of two blocks on GPU, no LoRA: the salt only on the first block.
        stored(
            block_hashes=[h(0), h(1)],
            parent_block_hash=None,
            token_ids=[101, 102, 103, 104, 105, 106, 107, 108],
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[("tenant-a",), None],
            **full,
        ),
        # A child block under LoRA adapter 2 (the second the engine knows), offloaded to CPU;
        # a token id above u16.
        stored(
            block_hashes=[h(2)],
            parent_block_hash=h(1),
            token_ids=[109, 110, 111, 128000],
            block_size=4,
            lora_id=2,
            medium="CPU",
            lora_name="sql-adapter",
            extra_keys=[("sql-adapter",)],
            **full,
        ),
        removed(block_hashes=[h(1), h(0)], medium="GPU", group_idx=0),
        removed(block_hashes=[h(2)], medium="CPU", group_idx=0),
        cleared(),
    ]


INT_HASHES = [BIG, 7, MAX, 99]
# sha256-sized digests with recognizable last eight bytes, and one 8-byte (xxhash64) digest.
BYTES_HASHES = [
    bytes(range(32)),
    bytes([0xAA] * 24) + bytes.fromhex("0102030405060708"),
    bytes([0x55] * 24) + bytes.fromhex("fffffffffffffffe"),
    bytes.fromhex("1122334455667788"),
]


# vLLM ~v0.9: fewer fields, and a batch without data_parallel_rank.
class V09BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class V09BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockRemoved"):
    block_hashes: list[int]


class V09AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag="AllBlocksCleared"):
    pass


class V09Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Union[V09BlockStored, V09BlockRemoved, V09AllBlocksCleared]]


def goldens():
    ints = lambda i: INT_HASHES[i]  # noqa: E731
    raw = lambda i: BYTES_HASHES[i]  # noqa: E731
    yield "array_int", v.ArrayBatch(ts=TS, events=events("array", ints), data_parallel_rank=2)
    yield "map_int", v.MapBatch(ts=TS, events=events("map", ints), data_parallel_rank=0)
    yield "array_bytes", v.ArrayBatch(ts=TS, events=events("array", raw))
    yield "map_bytes", v.MapBatch(ts=TS, events=events("map", raw))
    yield "sim_array_int", v.ArrayBatch(ts=TS, events=sim_events("array", ints), data_parallel_rank=2)
    yield "sim_map_int", v.MapBatch(ts=TS, events=sim_events("map", ints), data_parallel_rank=0)
    yield "sim_array_bytes", v.ArrayBatch(ts=TS, events=sim_events("array", raw))
    yield "sim_map_bytes", v.MapBatch(ts=TS, events=sim_events("map", raw))
    yield "v09_array", V09Batch(
        ts=2.5,
        events=[
            V09BlockStored(
                block_hashes=[5, 6], parent_block_hash=4, token_ids=list(range(32)), block_size=16, lora_id=None
            ),
            V09BlockRemoved(block_hashes=[5]),
            V09AllBlocksCleared(),
        ],
    )


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, batch in goldens():
        payload = msgspec.msgpack.encode(batch)
        # Round trip through vLLM's own decoders: the golden is something vLLM accepts.
        if name != "v09_array":
            era = name.removeprefix("sim_").split("_")[0]
            assert v.DECODERS[era].decode(payload) == batch, name
        with open(os.path.join(OUT, name + ".msgpack"), "wb") as f:
            f.write(payload)
        print(f"{name}.msgpack: {len(payload)} bytes")


if __name__ == "__main__":
    main()
