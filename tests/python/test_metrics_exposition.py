"""The agent's and the simulator's /metrics read by the Prometheus Python client's own parser,
as a scraper reads them: every family parses, histograms are whole (cumulative buckets ending
at +Inf equal to _count), and the counters say what was sent."""

import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families


def families(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def check_histograms(fams):
    seen = 0
    for f in fams.values():
        if f.type != "histogram":
            continue
        series = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, {"buckets": [], "count": None, "sum": None})
            if s.name.endswith("_bucket"):
                series[key]["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                series[key]["count"] = s.value
            elif s.name.endswith("_sum"):
                series[key]["sum"] = s.value
        for key, h in series.items():
            les = [le for le, _ in h["buckets"]]
            counts = [c for _, c in h["buckets"]]
            assert les == sorted(les) and les[-1] == float("inf"), (f.name, key, les)
            assert counts == sorted(counts), (f.name, key, counts)
            assert h["count"] == counts[-1] and h["sum"] is not None, (f.name, key, h)
            seen += 1
    return seen


def test_agent_and_engine_metrics_parse_as_prometheus_reads_them(start_sim, start_agent):
    sim = start_sim("--replicas", "2", "--kv-events-port", "0", "--kv-replay-port", "0")
    base = start_agent(sim)
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    for i in range(5):
        c.completions.create(model="sim-llama", prompt=f"metrics {i}", max_tokens=3, extra_body={"ignore_eos": True})
    stream = c.chat.completions.create(
        model="sim-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
        extra_body={"ignore_eos": True},
    )
    assert len(list(stream)) >= 2
    try:
        c.completions.create(model="nope", prompt="x", max_tokens=1)
    except openai.NotFoundError:
        pass

    agent = families(start_agent.admin + "/metrics")
    assert check_histograms(agent) > 0
    # Six answered requests: each endpoint's count and the TTFT histogram's count agree.
    served = sum(s.value for s in agent["warmpath_endpoint_requests"].samples)
    assert served == 6, agent["warmpath_endpoint_requests"].samples
    ttft = [s for s in agent["warmpath_ttft_seconds"].samples if s.name.endswith("_count")]
    assert sum(s.value for s in ttft) == 6, ttft

    for engine in sim.engines:
        fams = families(f"http://{engine['http']}/metrics")
        assert check_histograms(fams) > 0
        assert "vllm:time_to_first_token_seconds" in fams
