//! Renders of real published chat templates compared with transformers' own renders
//! (`tokenizer/tests/data/chat_renders.json`, written by `make_chat_renders.py` there with
//! transformers 5.23.0; the templates' sources are in that folder's README).

use std::collections::BTreeMap;

use super::*;

#[derive(serde::Deserialize)]
struct Fixture {
    now: String,
    templates: BTreeMap<String, TemplateEntry>,
    /// Raw JSON, so that members keep the order the client wrote them in.
    cases: BTreeMap<String, BTreeMap<String, Box<serde_json::value::RawValue>>>,
    renders: Vec<Render>,
}

#[derive(serde::Deserialize)]
struct TemplateEntry {
    path: String,
    special_tokens: serde_json::Map<String, serde_json::Value>,
    /// vLLM's content format for it, as the generator detects it on jinja2's syntax tree.
    content_format: String,
}

#[derive(serde::Deserialize)]
struct Render {
    template: String,
    case: String,
    rendered: Option<String>,
    error: Option<String>,
    /// `raised` (the template's `raise_exception`: its message is ours too) or `python` (a
    /// Python error: TypeError, an undefined name; its message is Python's).
    error_kind: Option<String>,
}

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(format!("{DATA}/chat_renders.json"))
        .expect("tokenizer/tests/data/chat_renders.json is committed");
    serde_json::from_str(&text).expect("the committed fixture is valid JSON")
}

/// The template as a `tokenizer_config.json` would give it, with the fixture's clock.
fn template(f: &Fixture, name: &str) -> ChatTemplate {
    let entry = &f.templates[name];
    let text = std::fs::read_to_string(format!("{DATA}/{}", entry.path))
        .unwrap_or_else(|e| panic!("{}: {e}", entry.path));
    let config = if entry.path.ends_with(".json") {
        serde_json::from_str(&text).expect("a committed tokenizer_config.json")
    } else {
        let mut config = entry.special_tokens.clone();
        config.insert("chat_template".into(), text.into());
        serde_json::Value::Object(config)
    };
    let mut t = ChatTemplate::from_config(&config)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .unwrap_or_else(|| panic!("{name} has a chat template"));
    t.set_clock(ChatClock::fixed(&f.now).unwrap()).unwrap();
    t
}

/// The case's request members as a client sends them, through [`Chat::from_json`].
fn chat(case: &BTreeMap<String, Box<serde_json::value::RawValue>>) -> Chat {
    let raw = |k: &str| case.get(k).map(|v| v.get());
    let add_generation_prompt = raw("add_generation_prompt") != Some("false");
    Chat::from_json(
        ChatJson {
            messages: raw("messages").expect("every case has messages"),
            tools: raw("tools"),
            documents: None,
            chat_template_kwargs: raw("chat_template_kwargs"),
        },
        add_generation_prompt,
    )
    .unwrap()
}

/// Checks every render of the template `name`, or of every template whose name starts with
/// `name` when it ends in `-` or `.` (a family); the renders checked.
fn check(name: &str) -> usize {
    let f = fixture();
    let mut checked = 0;
    let family = name.ends_with(['-', '.']);
    for r in f
        .renders
        .iter()
        .filter(|r| r.template == name || (family && r.template.starts_with(name)))
    {
        let t = template(&f, &r.template);
        let got = t.render(&chat(&f.cases[&r.case]));
        let what = format!("{} / {}", r.template, r.case);
        match (&r.rendered, &r.error, got) {
            (Some(want), None, Ok(got)) => assert_eq!(&got, want, "{what}"),
            (None, Some(want), Err(Error::Template(got)))
                if r.error_kind.as_deref() != Some("python") =>
            {
                assert_eq!(&got, want, "{what}")
            }
            // Python's own error (its message is Python's): the render fails here too.
            (None, Some(_), Err(Error::Template(_))) => {}
            // The one known difference: a `for` over `none` (a tool-use template given no
            // tools) is a TypeError in jinja2 and no iterations in minijinja, so the keys are
            // computed for a request vLLM answers with 400.
            (None, Some(want), Ok(_))
                if want == "'NoneType' object is not iterable"
                    && r.template.contains("tool-use") => {}
            (_, _, got) => panic!(
                "{what}: transformers gave {:?} / {:?}, we gave {got:?}",
                r.rendered, r.error
            ),
        }
        checked += 1;
    }
    checked
}

#[test]
fn llama_3_templates_render_as_transformers_does() {
    // Llama 3.2's date comes from strftime_now("%d %b %Y"); 3.1 and 3.3 hard-code theirs.
    assert_eq!(check("llama-3."), 3 * 8);
    let f = fixture();
    let r = f
        .renders
        .iter()
        .find(|r| r.template == "llama-3.2" && r.case == "simple")
        .unwrap();
    assert!(
        r.rendered
            .as_ref()
            .unwrap()
            .contains("Today Date: 06 Jul 2024\n")
    );
}

#[test]
fn qwen_templates_render_as_transformers_does() {
    // Qwen2.5: tools through tojson; Qwen3 (a full tokenizer_config.json): namespace,
    // messages[::-1], str.split/lstrip/startswith, chat_template_kwargs (enable_thinking).
    assert_eq!(check("qwen2.5") + check("qwen3"), 2 * 8);
}

#[test]
fn mistral_and_deepseek_templates_render_as_transformers_does() {
    // Mistral Nemo raises on broken role alternation; its tools go through dict.items().
    assert_eq!(check("mistral-nemo"), 8);
    assert_eq!(check("deepseek-r1-distill-llama"), 8);
}

#[test]
fn more_published_templates_render_as_transformers_does() {
    // Gemma 2 (raises on a system role) and 4, Phi-3.5, Granite 3.3, 4.0 and 4.1, gpt-oss
    // (harmony), Mistral Small 3.2, Devstral and Ministral 3, Kimi K2 and K2 Thinking,
    // SmolLM3, functionary 3.2, GLM 4.6 and 4.7, DeepSeek V3.1 and V3.2, QwQ, Qwen3.5,
    // Qwen3-Coder (`tools is iterable`: jinja2's test, none is not), Apriel 1.5 (tools printed
    // with `| string`: Python's `str()` of a dict), MiniMax M2, Nemotron Nano 2, Seed-OSS,
    // LFM2, and the tool-use variants of Hermes 2 Pro / 3 and Command R+ / R7B.
    let families = [
        ("gemma-", 2),
        ("phi-3.5", 1),
        ("granite-", 3),
        ("gpt-oss", 1),
        ("mistral-small-3.2", 1),
        ("devstral-small", 1),
        ("kimi-k2", 1),
        ("smollm3", 1),
        ("functionary-3.2", 1),
        ("glm-4.6", 1),
        ("deepseek-v3.1", 1),
        ("qwq", 1),
        ("qwen3-coder", 1),
        ("hermes-", 2),
        ("command-r-plus-tool-use", 1),
        ("command-r7b-tool-use", 1),
        ("qwen3.5", 1),
        ("apriel-1.5", 1),
        ("deepseek-v3.2", 1),
        ("glm-4.7-flash", 1),
        ("minimax-m2", 1),
        ("nemotron-nano-v2", 1),
        ("seed-oss", 1),
        ("kimi-k2-thinking", 1),
        ("ministral-3-reasoning", 1),
        ("lfm2", 1),
    ];
    for (prefix, templates) in families {
        assert_eq!(check(prefix), templates * 8, "{prefix}");
    }
    // Each of them renders, or fails as transformers does, on the cases without tools but
    // the tool-use variants (written for requests with tools).
    let f = fixture();
    let rendered = |name: &str| {
        f.renders
            .iter()
            .filter(|r| r.template == name && r.rendered.is_some())
            .count()
    };
    assert_eq!(rendered("qwen3-coder"), 8);
    assert_eq!(rendered("apriel-1.5"), 8);
    assert_eq!(rendered("gpt-oss"), 6);
    assert_eq!(rendered("hermes-3-tool-use"), 0);
}

#[test]
fn a_list_of_named_templates_renders_tool_use_for_requests_with_tools() {
    // transformers' get_chat_template: `tool_use` when the request has tools, else `default`.
    let config = serde_json::json!({"chat_template": [
        {"name": "default", "template": "D{{ messages | length }}{{ tools is none }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]});
    let t = ChatTemplate::from_config(&config).unwrap().unwrap();
    let messages = r#"[{"role": "user", "content": "hi"}]"#;
    let tools = r#"[{"type": "function", "function": {"name": "f"}}, {"function": {"name": "g"}}]"#;
    let chat = |tools| {
        Chat::from_json(
            ChatJson {
                messages,
                tools,
                documents: None,
                chat_template_kwargs: None,
            },
            true,
        )
        .unwrap()
    };
    assert_eq!(t.render(&chat(None)).unwrap(), "D1True");
    assert_eq!(t.render(&chat(Some(tools))).unwrap(), "T2");
    // Without a tool_use template, tools or not, the default.
    let config = serde_json::json!({"chat_template": [{"name": "default", "template": "D"}]});
    let t = ChatTemplate::from_config(&config).unwrap().unwrap();
    assert_eq!(t.render(&chat(Some(tools))).unwrap(), "D");
}

#[test]
fn the_content_format_is_detected_as_vllm_detects_it() {
    // The generator detects it on jinja2's tree, written again from vLLM; here on minijinja's.
    let f = fixture();
    let mut openai = Vec::new();
    for (name, entry) in &f.templates {
        let t = template(&f, name);
        assert_eq!(
            if t.default.openai { "openai" } else { "string" },
            entry.content_format,
            "{name}"
        );
        if t.default.openai {
            openai.push(name.as_str());
        }
    }
    // Gemma 4, Mistral Small 3.2, Devstral, Ministral 3, GLM 4.6 / 4.7, Kimi K2, Qwen3.5,
    // MiniMax M2, Granite 4.0 / 4.1, Apriel 1.5: 12 of the fixture's 37.
    assert_eq!(openai.len(), 12, "{openai:?}");
}

#[test]
fn every_fixture_render_is_checked() {
    let f = fixture();
    assert_eq!(f.renders.len(), f.templates.len() * f.cases.len());
    assert!(f.renders.iter().any(|r| r.error.is_some()));
}

#[test]
fn continue_final_message_leaves_the_last_turn_open() {
    let f = fixture();
    let t = template(&f, "qwen2.5");
    let mut chat = Chat::from_messages(
        &[
            ChatMessage {
                role: "user".into(),
                content: "Name a colour.".into(),
            },
            ChatMessage {
                role: "assistant".into(),
                content: "The colour is ".into(),
            },
        ],
        false,
    );
    chat.continue_final_message = true;
    let text = t.render(&chat).unwrap();
    assert!(
        text.ends_with("<|im_start|>assistant\nThe colour is "),
        "{text:?}"
    );
    chat.add_generation_prompt = true;
    assert!(matches!(t.render(&chat), Err(Error::Request(_))));
}

#[test]
fn malformed_requests_are_request_errors() {
    let read = |messages: &str, tools: Option<&str>| {
        Chat::from_json(
            ChatJson {
                messages,
                tools,
                ..ChatJson::default()
            },
            true,
        )
    };
    for (messages, tools) in [
        ("{", None),
        (r#"[{"content": "no role"}]"#, None),
        (r#"[{"role": "user", "content": 5}]"#, None),
        (
            r#"[{"role": "user", "content": [{"text": "untyped"}]}]"#,
            None,
        ),
        (
            r#"[{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]"#,
            None,
        ),
        (
            r#"[{"role": "user", "content": "hi"}]"#,
            Some(r#"[{"type": "function"}]"#),
        ),
    ] {
        let err = read(messages, tools).unwrap_err();
        assert!(matches!(err, Error::Request(_)), "{messages}: {err}");
    }
    let image = r#"[{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]"#;
    assert_eq!(read(image, None).unwrap().non_text_parts(), 1);
}

/// Any JSON at all where a request's messages, tools and kwargs go: an error or a render,
/// never a panic (these members are untrusted client input).
mod untrusted {
    use proptest::prelude::*;

    use super::*;

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            prop_oneof![
                Just("user".to_string()),
                Just("assistant".to_string()),
                Just("tool".to_string()),
                Just("text".to_string()),
                Just("{\"a\": [1, {}]}".to_string()),
                ".{0,8}",
            ]
            .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            let keys = prop_oneof![
                Just("role".to_string()),
                Just("content".to_string()),
                Just("type".to_string()),
                Just("text".to_string()),
                Just("tool_calls".to_string()),
                Just("function".to_string()),
                Just("arguments".to_string()),
                Just("name".to_string()),
                "[a-z]{1,3}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::vec((keys, inner), 0..4)
                    .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
            ]
        })
    }

    /// Messages mostly shaped like messages (a role, odd contents and members), sometimes not.
    fn messages() -> impl Strategy<Value = serde_json::Value> {
        let role = prop_oneof![
            Just("system"),
            Just("user"),
            Just("assistant"),
            Just("tool")
        ];
        let content = prop_oneof![
            3 => ".{0,12}".prop_map(serde_json::Value::from),
            1 => json(),
        ];
        let message = (role, content, json(), "[a-z_]{1,12}").prop_map(|(role, content, extra, key)| {
            serde_json::json!({"role": role, "content": content, key: extra})
        });
        prop_oneof![
            4 => prop::collection::vec(message, 0..5).prop_map(serde_json::Value::from),
            1 => json(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6368_6174),
            ..ProptestConfig::default()
        })]
        #[test]
        fn any_json_is_an_error_or_a_render(
            messages in messages(),
            tools in prop_oneof![3 => Just(serde_json::Value::Null), 1 => json()],
            kwargs in prop_oneof![3 => Just(serde_json::Value::Null), 1 => json()],
        ) {
            let f = fixture();
            let templates = [template(&f, "qwen3"), template(&f, "llama-3.1"), template(&f, "mistral-nemo")];
            let (m, t, k) = (messages.to_string(), tools.to_string(), kwargs.to_string());
            let chat = Chat::from_json(
                ChatJson {
                    messages: &m,
                    tools: Some(&t),
                    documents: Some(&k),
                    chat_template_kwargs: Some(&k),
                },
                true,
            );
            if let Ok(chat) = chat {
                for t in &templates {
                    let _ = t.render(&chat);
                }
                prop_assert!(messages.is_array());
            }
        }
    }
}
