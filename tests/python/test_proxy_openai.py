"""The official `openai` client, unchanged, through the warmpath proxy."""

import openai

SHARED = " ".join(["Our support desk answers billing questions politely and precisely."] * 50)


def test_openai_client_through_the_proxy(start_sim, start_agent):
    sim = start_sim("--replicas", "2", "--kv-events-port", "0", "--kv-replay-port", "0")
    base = start_agent(sim)
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

    r = c.completions.create(model="sim-llama", prompt="Hello there", max_tokens=4, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4 and len(r.choices[0].text.split()) == 4

    chunks = list(
        c.chat.completions.create(
            model="sim-llama", messages=[{"role": "system", "content": SHARED}, {"role": "user", "content": "One?"}],
            max_tokens=3, stream=True, stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 3

    # The same conversation prefix again: routed to the pod holding it, served from cache.
    raw = c.chat.completions.with_raw_response.create(
        model="sim-llama", messages=[{"role": "system", "content": SHARED}, {"role": "user", "content": "Two?"}],
        max_tokens=3,
    )
    again = raw.parse()
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert int(raw.headers["x-warmpath-prefix-blocks"]) > 0

    try:
        c.completions.create(model="nope", prompt="x", max_tokens=1)
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError as e:
        assert "does not exist" in str(e)
