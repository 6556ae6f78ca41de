"""The official `openai` client against the simulator: content, usage and cached_tokens."""

import openai
import pytest

SHARED = " ".join(["The shared system prompt explains the rules of the support desk in detail."] * 60)


def client(sim):
    return openai.OpenAI(base_url=sim.url() + "/v1", api_key="unused", max_retries=0)


def test_completions_plain_and_streaming(start_sim):
    c = client(start_sim())
    r = c.completions.create(model="sim-llama", prompt="Hello there", max_tokens=5, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens > 1
    assert len(r.choices[0].text.split()) == 5

    chunks = list(
        c.completions.create(
            model="sim-llama", prompt="Hello there", max_tokens=5, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == r.choices[0].text, "same prompt, same seed, same tokens"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.completion_tokens == 5
    assert all(ch.usage is None for ch in chunks[:-1])


def test_chat_plain_and_streaming_with_cached_tokens(start_sim):
    c = client(start_sim())
    messages = [{"role": "system", "content": SHARED}, {"role": "user", "content": "First question?"}]
    first = c.chat.completions.create(model="sim-llama", messages=messages, max_tokens=4)
    assert first.object == "chat.completion"
    assert first.choices[0].message.role == "assistant"
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    messages[1]["content"] = "A different question?"
    stream = c.chat.completions.create(
        model="sim-llama", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content.strip()
    usage = chunks[-1].usage
    cached = usage.prompt_tokens_details.cached_tokens
    # Everything up to the last full 16-token block before the differing user turn is cached.
    assert cached > 0 and cached % 16 == 0
    assert usage.prompt_tokens - cached < 48


def test_errors_surface_as_openai_exceptions(start_sim):
    c = client(start_sim("--max-model-len", "512", "--num-gpu-blocks", "64"))
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="nope", prompt="x", max_tokens=1)
    assert "does not exist" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="sim-llama", prompt="word " * 2000, max_tokens=1)


def test_models_lists_lora_adapters_with_parent(start_sim):
    c = client(start_sim("--lora-modules", "sql-lora=/adapters/sql"))
    models = {m.id: m for m in c.models.list().data}
    assert set(models) == {"sim-llama", "sql-lora"}
    assert models["sql-lora"].model_extra["parent"] == "sim-llama"
    r = c.completions.create(model="sql-lora", prompt="select", max_tokens=2)
    assert r.model == "sql-lora"
