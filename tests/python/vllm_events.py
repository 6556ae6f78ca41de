"""vLLM's KV event structs, written from the reference (vllm/distributed/kv_events.py), for
both wire eras: events as tagged arrays (array era) or tagged maps (map era)."""

from typing import Optional, Union

import msgspec

ExternalBlockHash = Union[int, bytes]


class _BlockStoredFields(msgspec.Struct, omit_defaults=True):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class _BlockRemovedFields(msgspec.Struct, omit_defaults=True):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None


class ArrayBlockStored(_BlockStoredFields, array_like=True, tag="BlockStored"):
    pass


class ArrayBlockRemoved(_BlockRemovedFields, array_like=True, tag="BlockRemoved"):
    pass


class ArrayAllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class MapBlockStored(_BlockStoredFields, tag="BlockStored"):
    pass


class MapBlockRemoved(_BlockRemovedFields, tag="BlockRemoved"):
    pass


class MapAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Union[ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


class MapBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Union[MapBlockStored, MapBlockRemoved, MapAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


DECODERS = {
    "array": msgspec.msgpack.Decoder(ArrayBatch),
    "map": msgspec.msgpack.Decoder(MapBatch),
}
