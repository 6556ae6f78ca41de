// The official `openai` Node client, unchanged (its HTTP is Node's own fetch, undici), through
// the warmpath proxy in front of a simulator fleet: real processes on loopback, stopped after.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import path from "node:path";
import OpenAI from "openai";

const here = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.env.WARMPATH_BIN ?? path.join(here, "..", "..", "target", "debug", "warmpath");
const SHARED = Array(50).fill("Our support desk answers billing questions politely and precisely.").join(" ");
const children = [];
let client;
let base;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function start(args, { stdout = "ignore" } = {}) {
  const child = spawn(BIN, args, { stdio: ["ignore", stdout, "inherit"] });
  children.push(child);
  return child;
}

// The simulator prints one JSON line with its engines' addresses once they listen.
async function startSim() {
  const sim = start(["sim", "--port", "0", "--profile", "tiny", "--replicas", "2",
    "--kv-events-port", "0", "--kv-replay-port", "0"], { stdout: "pipe" });
  const lines = createInterface({ input: sim.stdout });
  for await (const line of lines) {
    return JSON.parse(line).engines;
  }
  throw new Error(`${BIN} sim exited before it was ready`);
}

async function ready(url, deadlineMs) {
  const until = Date.now() + deadlineMs;
  for (;;) {
    try {
      const r = await fetch(url);
      if (r.status === 200) return;
    } catch {
      // not listening yet
    }
    assert.ok(Date.now() < until, `${url} not ready in ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

before(async () => {
  const engines = await startSim();
  const [listen, admin] = [await freePort(), await freePort()];
  const args = ["agent", "--listen", `127.0.0.1:${listen}`, "--admin", `127.0.0.1:${admin}`, "--explain"];
  for (const e of engines) {
    args.push("--endpoint", `http://${e.http}`, "--kv-events", e.kv_events, "--kv-replay", e.kv_replay);
  }
  start(args);
  await ready(`http://127.0.0.1:${admin}/ready`, 20000);
  base = `http://127.0.0.1:${listen}`;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30000 });
});

after(() => {
  for (const c of children) c.kill("SIGTERM");
});

test("models list as vLLM's cards", async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.deepEqual(ids, ["sim-llama"]);
  const now = Date.now() / 1000;
  assert.ok(Math.abs(page.data[0].created - now) < 600, `created ${page.data[0].created}`);
});

test("a completion, then a chat stream with usage, then the same prefix served from cache", async () => {
  const r = await client.completions.create({ model: "sim-llama", prompt: "Hello there", max_tokens: 4, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 4);
  assert.equal(r.choices[0].text.trim().split(/\s+/).length, 4);

  const messages = (q) => [{ role: "system", content: SHARED }, { role: "user", content: q }];
  const stream = await client.chat.completions.create({
    model: "sim-llama", messages: messages("One?"), max_tokens: 3, ignore_eos: true,
    stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 3);

  const { data, response } = await client.chat.completions
    .create({ model: "sim-llama", messages: messages("Two?"), max_tokens: 3 })
    .withResponse();
  assert.ok(data.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(data.usage));
  assert.ok(Number(response.headers.get("x-warmpath-prefix-blocks")) > 0);
});

test("errors arrive as the client's typed errors", async () => {
  await assert.rejects(
    client.completions.create({ model: "nope", prompt: "x", max_tokens: 1 }),
    (e) => e instanceof OpenAI.NotFoundError && /does not exist/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model: "sim-llama", messages: [{ role: "user", content: "x" }], max_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "max_tokens",
  );
});

test("concurrent streams all finish, and an aborted one leaves the proxy serving", async () => {
  const one = async (i) => {
    const s = await client.chat.completions.create({
      model: "sim-llama", messages: [{ role: "system", content: SHARED }, { role: "user", content: `q${i}` }],
      max_tokens: 8, ignore_eos: true, stream: true,
    });
    let text = "";
    for await (const c of s) text += c.choices[0]?.delta?.content ?? "";
    return text;
  };
  const texts = await Promise.all(Array.from({ length: 40 }, (_, i) => one(i)));
  assert.equal(texts.length, 40);
  assert.ok(texts.every((t) => t.trim().split(/\s+/).length === 8), JSON.stringify(texts.slice(0, 3)));

  const long = await client.completions.create({
    model: "sim-llama", prompt: "tell me a long story", max_tokens: 2000, ignore_eos: true, stream: true,
  });
  let seen = 0;
  for await (const _ of long) {
    seen += 1;
    if (seen === 3) {
      long.controller.abort();
      break;
    }
  }
  assert.equal(seen, 3);
  const after = await client.completions.create({ model: "sim-llama", prompt: "still there?", max_tokens: 2, ignore_eos: true });
  assert.equal(after.usage.completion_tokens, 2);
});
