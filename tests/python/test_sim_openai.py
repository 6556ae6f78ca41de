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


@pytest.mark.parametrize(
    "kind, params, param",
    [
        ("completion", {"logprobs": 2}, "logprobs"),
        # vLLM answers logprobs=0 with the chosen tokens' own: a request for them too.
        ("completion", {"logprobs": 0}, "logprobs"),
        ("completion", {"echo": True}, "echo"),
        ("completion", {"n": 2}, "n"),
        ("completion", {"best_of": 3}, "best_of"),
        ("completion", {"extra_body": {"prompt_logprobs": 1}}, "prompt_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"n": 3}, "n"),
        ("completion", {"extra_body": {"min_tokens": 9}}, "min_tokens"),
        ("chat", {"extra_body": {"min_tokens": -1}}, "min_tokens"),
    ],
)
def test_what_the_simulator_cannot_answer_is_refused_by_name(start_sim, kind, params, param):
    # Log probabilities, echoed prompts and several samples are refused, never answered
    # without (a client reading `choices[0].logprobs` would get None); min_tokens is checked
    # as vLLM checks it (0 <= min_tokens <= max_tokens).
    c = client(start_sim())
    with pytest.raises(openai.BadRequestError) as e:
        if kind == "completion":
            c.completions.create(model="sim-llama", prompt="x", max_tokens=4, **params)
        else:
            c.chat.completions.create(model="sim-llama", messages=[{"role": "user", "content": "x"}], max_tokens=4, **params)
    assert e.value.body["param"] == param, e.value.body
    # Asking for none is no request for them.
    r = c.completions.create(model="sim-llama", prompt="x", max_tokens=2, logprobs=None, echo=False, n=1, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


def test_min_tokens_holds_stop_strings_back_too(start_sim):
    # vLLM looks for stop strings only once more than min_tokens tokens are out. The answer
    # of a prompt with ignore_eos, cut at the first occurrence of one of its own words, stops
    # there without min_tokens and runs past it with min_tokens beyond that point.
    c = client(start_sim())
    full = c.completions.create(model="sim-llama", prompt="stop words", max_tokens=40, extra_body={"ignore_eos": True})
    words = full.choices[0].text.split()
    stop = words[3]
    first = full.choices[0].text.index(" " + stop)
    cut = c.completions.create(model="sim-llama", prompt="stop words", max_tokens=40, stop=[" " + stop], extra_body={"ignore_eos": True})
    assert (cut.choices[0].finish_reason, cut.choices[0].text) == ("stop", full.choices[0].text[:first])
    # vLLM's include_stop_str_in_output keeps the stop string at the end of the text.
    kept = c.completions.create(
        model="sim-llama", prompt="stop words", max_tokens=40, stop=[" " + stop],
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == full.choices[0].text[: first + len(" " + stop)]
    assert kept.choices[0].model_extra["stop_reason"] == " " + stop
    held = c.completions.create(
        model="sim-llama", prompt="stop words", max_tokens=40, stop=[" " + stop],
        extra_body={"ignore_eos": True, "min_tokens": 40},
    )
    assert (held.choices[0].finish_reason, held.usage.completion_tokens) == ("length", 40)
    assert held.choices[0].text == full.choices[0].text


def test_min_tokens_holds_eos_back(start_sim):
    # Without ignore_eos each prompt ends at its own natural length (16 tokens or more, drawn
    # from the prompt); find prompts that end by EOS before 60 tokens, then ask them again
    # with min_tokens=60: each runs to max_tokens.
    c = client(start_sim())
    early = []
    for i in range(40):
        r = c.completions.create(model="sim-llama", prompt=f"prompt number {i}", max_tokens=60)
        if r.choices[0].finish_reason == "stop":
            assert r.usage.completion_tokens < 60
            early.append(f"prompt number {i}")
    assert len(early) >= 2, "some prompts end before 60 tokens"
    for prompt in early:
        r = c.completions.create(model="sim-llama", prompt=prompt, max_tokens=60, extra_body={"min_tokens": 60})
        assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 60)
        # A lower floor lets EOS come at its natural place again when that is past it.
        r = c.completions.create(model="sim-llama", prompt=prompt, max_tokens=60, extra_body={"min_tokens": 1})
        assert r.choices[0].finish_reason == "stop"


def test_models_lists_lora_adapters_with_parent(start_sim):
    c = client(start_sim("--lora-modules", "sql-lora=/adapters/sql"))
    models = {m.id: m for m in c.models.list().data}
    assert set(models) == {"sim-llama", "sql-lora"}
    assert models["sql-lora"].model_extra["parent"] == "sim-llama"
    r = c.completions.create(model="sql-lora", prompt="select", max_tokens=2)
    assert r.model == "sql-lora"
