"""The simulator's KV events decoded with msgspec structs written from the reference, and its
replay endpoint exercised with a pyzmq DEALER."""

import json
import urllib.request

import msgspec
import pytest
import zmq

from conftest import wait_until
from vllm_events import DECODERS

END_SEQ = b"\xff" * 8


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def prompt_tokens(seed, n):
    return [100 + (seed * 7919 + i * 31) % 5000 for i in range(n)]


class Subscriber:
    """A SUB socket that is known to be connected (slow-joiner safe) before the test starts."""

    def __init__(self, ctx, sim):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(sim.events())
        self.sim = sim
        seed = 0

        def probe():
            nonlocal seed
            seed += 1
            # Probe prompts use ids below 100, which test prompts never contain.
            probe = [5 + seed % 90, 5 + seed // 90 % 90] + [6] * 14
            post(sim.url(), "/v1/completions", {"prompt": probe, "max_tokens": 1})
            return self.sock.poll(100)

        wait_until("first event", probe)
        self.drain()

    def drain(self):
        out = []
        while self.sock.poll(300):
            out.append(self.sock.recv_multipart())
        return out


@pytest.mark.parametrize("fmt", ["array", "map"])
@pytest.mark.parametrize("hash_bytes", [False, True])
def test_events_decode_field_by_field(start_sim, fmt, hash_bytes):
    flags = ["--kv-events-port", "0", "--kv-events-format", fmt, "--max-num-batched-tokens", "4096"]
    if hash_bytes:
        flags.append("--kv-events-hash-bytes")
    sim = start_sim(*flags)
    ctx = zmq.Context()
    sub = Subscriber(ctx, sim)
    decode = DECODERS[fmt]

    tokens = prompt_tokens(1, 40)
    post(sim.url(), "/v1/completions", {"prompt": tokens, "max_tokens": 1})
    frames = sub.drain()
    assert len(frames) == 1
    topic, seq, payload = frames[0]
    assert topic == b"" and len(seq) == 8
    batch = decode.decode(payload)
    assert batch.data_parallel_rank is None
    assert batch.ts > 1.7e9
    [stored] = batch.events
    assert type(stored).__name__.endswith("BlockStored")
    assert stored.token_ids == tokens[:32]
    assert stored.block_size == 16
    assert len(stored.block_hashes) == 2
    for h in stored.block_hashes:
        assert isinstance(h, bytes) and len(h) == 32 if hash_bytes else isinstance(h, int) and 0 <= h < 2**64
    assert stored.parent_block_hash is None
    assert stored.lora_id is None and stored.lora_name is None
    assert stored.medium == "GPU"
    assert stored.extra_keys == [None, None]
    assert stored.group_idx == 0 and stored.kv_cache_spec_kind == "full_attention"
    raw = msgspec.msgpack.decode(payload)
    event = raw[1][0]
    if fmt == "map":
        assert event["type"] == "BlockStored"
        assert "lora_name" in event and "kv_cache_spec_sliding_window" not in event, "vLLM's omission rules"
    else:
        assert event[0] == "BlockStored" and len(event) == 12, "every declared field, trailing nils too"

    # A continuation names its parent; a salted request changes the chain and carries the salt.
    post(sim.url(), "/v1/completions", {"prompt": tokens + prompt_tokens(2, 16), "max_tokens": 1})
    [cont] = decode.decode(sub.drain()[0][2]).events
    assert cont.parent_block_hash == stored.block_hashes[1]
    assert cont.token_ids[:8] == tokens[32:40]
    post(sim.url(), "/v1/completions", {"prompt": tokens, "max_tokens": 1, "cache_salt": "tenant-a"})
    [salted] = decode.decode(sub.drain()[0][2]).events
    assert salted.extra_keys[0] == ("tenant-a",) and salted.extra_keys[1] is None
    assert not set(salted.block_hashes) & set(stored.block_hashes)

    status, _ = post(sim.url(), "/reset_prefix_cache", {})
    assert status == 200
    [cleared] = decode.decode(sub.drain()[0][2]).events
    assert type(cleared).__name__.endswith("AllBlocksCleared")
    ctx.destroy(linger=0)


def test_eviction_emits_block_removed(start_sim):
    sim = start_sim("--kv-events-port", "0", "--num-gpu-blocks", "8", "--max-model-len", "128")
    ctx = zmq.Context()
    sub = Subscriber(ctx, sim)
    for seed in range(4):
        post(sim.url(), "/v1/completions", {"prompt": prompt_tokens(100 + seed, 64), "max_tokens": 1})
    events = [e for f in sub.drain() for e in DECODERS["map"].decode(f[2]).events]
    removed = [h for e in events if type(e).__name__ == "MapBlockRemoved" for h in e.block_hashes]
    stored = [h for e in events if type(e).__name__ == "MapBlockStored" for h in e.block_hashes]
    assert removed, "a cache of 8 blocks cannot keep 4 x 4 blocks"
    assert set(removed) <= set(stored) | set(removed)
    ctx.destroy(linger=0)


@pytest.mark.parametrize("layout", ["v0.25", "v0.26"])
def test_replay_fills_dropped_batches(start_sim, layout):
    sim = start_sim(
        "--kv-events-port", "0", "--kv-replay-port", "0", "--kv-events-replay-layout", layout,
        "--fault-drop-event-batch-every", "2",
    )
    ctx = zmq.Context()
    sub = Subscriber(ctx, sim)
    for seed in range(6):
        post(sim.url(), "/v1/completions", {"prompt": prompt_tokens(200 + seed, 32), "max_tokens": 1})
    live = {int.from_bytes(f[1], "big"): f[2] for f in sub.drain()}
    seqs = sorted(live)
    assert seqs and any(b - a > 1 for a, b in zip(seqs, seqs[1:])), f"expected gaps, got {seqs}"

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(sim.replay())
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = {}
    while True:
        assert dealer.poll(5000), "replay answered"
        frames = dealer.recv_multipart()
        if layout == "v0.25":
            assert frames[0] == b"" and len(frames) == 3
            _, seq, payload = frames
        else:
            assert frames[0] == b"" and len(frames) == 4
            _, topic, seq, payload = frames
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                break
            assert topic == b""
        if seq == END_SEQ:
            assert payload == b""
            break
        replayed[int.from_bytes(seq, "big")] = payload
    for s, payload in live.items():
        assert replayed[s] == payload, "replay returns the same bytes"
    missing = set(range(min(seqs), max(seqs) + 1)) - set(seqs)
    assert missing and missing <= set(replayed), "replay has every dropped batch"
    for s in missing:
        DECODERS["map"].decode(replayed[s])
    ctx.destroy(linger=0)


def test_cpu_tier_events_carry_medium_cpu(start_sim):
    sim = start_sim("--kv-events-port", "0", "--num-gpu-blocks", "8", "--cpu-offload-blocks", "32", "--max-model-len", "128")
    ctx = zmq.Context()
    sub = Subscriber(ctx, sim)
    for seed in range(4):
        post(sim.url(), "/v1/completions", {"prompt": prompt_tokens(300 + seed, 64), "max_tokens": 1})
    events = [e for f in sub.drain() for e in DECODERS["map"].decode(f[2]).events]
    cpu_stored = [e for e in events if type(e).__name__ == "MapBlockStored" and e.medium == "CPU"]
    gpu_removed = [h for e in events if type(e).__name__ == "MapBlockRemoved" and e.medium == "GPU" for h in e.block_hashes]
    assert cpu_stored and gpu_removed
    assert {h for e in cpu_stored for h in e.block_hashes} <= set(gpu_removed), "the CPU tier holds GPU victims"
    assert all(len(e.token_ids) == 16 and len(e.block_hashes) == 1 for e in cpu_stored)
    # The first request's prefix comes back from the CPU tier: reported as cached.
    _, body = post(sim.url(), "/v1/completions", {"prompt": prompt_tokens(300, 64), "max_tokens": 1})
    assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    ctx.destroy(linger=0)
