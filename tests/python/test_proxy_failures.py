"""Pods dying under live streams, seen by real HTTP clients through a real agent process."""

import json
import signal
import urllib.request

import httpx


class Both:
    """Two simulator processes presented as one fleet to the agent fixture."""

    def __init__(self, *sims):
        self.engines = [e for s in sims for e in s.engines]


def open_stream(client, base, prompt):
    body = {"model": "sim-llama", "prompt": prompt, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    req = client.build_request("POST", base + "/v1/completions", json=body)
    resp = client.send(req, stream=True)
    assert resp.status_code == 200, resp.read()
    return resp, resp.iter_lines()


def next_event(lines):
    for line in lines:
        if line.startswith("data: "):
            return line[len("data: "):]
    return None


def test_a_killed_pod_ends_its_streams_with_an_error_event_and_others_continue(start_sim, start_agent):
    sims = [start_sim(), start_sim()]
    base = start_agent(Both(*sims), "--policy", "round-robin")
    with httpx.Client(timeout=30) as client:
        a, a_lines = open_stream(client, base, "the first long story")
        b, b_lines = open_stream(client, base, "the second long story")
        pods = {a.headers["x-warmpath-pod"], b.headers["x-warmpath-pod"]}
        assert len(pods) == 2, pods
        assert next_event(a_lines) and next_event(b_lines)
        # Kill the pod serving stream a, hard.
        victim = next(s for s in sims if s.engines[0]["http"] == a.headers["x-warmpath-pod"])
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        events = []
        while (event := next_event(a_lines)) is not None:
            events.append(event)
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["code"] == 502 and "failed mid-stream" in error["message"], error
        # Stream b is untouched: it keeps producing tokens after the kill.
        for _ in range(20):
            chunk = json.loads(next_event(b_lines))
            assert chunk["choices"][0]["text"] is not None
        b.close()
        a.close()
        # New requests go to the surviving pod (the dead one fails before the first byte).
        for i in range(3):
            r = client.post(base + "/v1/completions", json={"model": "sim-llama", "prompt": f"after {i}", "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.headers["x-warmpath-pod"] == b.headers["x-warmpath-pod"]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def dechunk(raw):
    """The body of an HTTP/1.1 chunked response."""
    _, _, body = raw.partition(b"\r\n\r\n")
    out, i = bytearray(), 0
    while True:
        j = body.index(b"\r\n", i)
        n = int(body[i:j], 16)
        if n == 0:
            return bytes(out)
        out += body[j + 2 : j + 2 + n]
        i = j + 2 + n + 2


STREAMS, TOKENS = 16, 30000


def test_slow_clients_get_backpressure_not_unbounded_buffering(start_sim, start_agent):
    """Clients that stop reading: the engines produce everything, the agent's memory stays flat,
    and every stream then arrives complete."""
    import socket

    # Large blocks: room for every stream's KV without a huge block table.
    sim = start_sim("--time-scale", "0.01", "--block-size", "128")
    base = start_agent(sim)
    agent = start_agent.proc
    port = int(base.rsplit(":", 1)[1])
    before = rss_kib(agent.pid)
    socks = []
    for i in range(STREAMS):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        body = json.dumps({"model": "sim-llama", "prompt": f"stream {i}", "max_tokens": TOKENS,
                           "ignore_eos": True, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        socks.append(s)
    # The engine finishes every request (its output is queued on its side): everything
    # exists now, and none of it has been read by the clients.
    from conftest import wait_until

    def generated_every_token():
        # The engine is busy producing 480k tokens: on a loaded machine one scrape can take
        # longer than its timeout. That is "not yet", not a failure; wait_until bounds the wait.
        try:
            return metric(sim.url(), "vllm:generation_tokens_total") >= STREAMS * TOKENS
        except OSError:  # socket.timeout and URLError are OSErrors
            return False

    wait_until("the engine generated every token", generated_every_token, timeout=120)
    grown = rss_kib(agent.pid) - before
    produced = 0
    for s in socks:
        raw = bytearray()
        while chunk := s.recv(1 << 20):
            raw += chunk
        s.close()
        produced += len(raw)
        events = dechunk(bytes(raw)).split(b"\n\n")
        assert events[-2] == b"data: [DONE]", events[-3:]
        assert sum(1 for e in events if e.startswith(b"data: {")) == TOKENS + 1  # + the finish chunk
    # A proxy that buffered for slow clients would hold nearly all of it; warmpath holds a
    # bounded amount per connection (hyper's read and write buffers).
    print(f"agent RSS grew {grown} KiB while {produced >> 10} KiB waited for slow clients")
    assert grown * 1024 < produced / 2, f"agent RSS grew {grown} KiB of {produced >> 10} KiB produced"
