use super::*;

#[test]
fn builtin_round_trips_and_is_about_four_chars_per_token() {
    let tok = Tokenizer::builtin();
    let text = crate::text::TextGen::new(99).text(20_000);
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let chars_per_token = text.len() as f64 / ids.len() as f64;
    assert!(
        (3.0..=5.5).contains(&chars_per_token),
        "{chars_per_token:.2} chars/token"
    );
}

#[test]
fn completions_add_bos_chat_does_not() {
    let tok = Tokenizer::builtin();
    let bos = tok.inner.token_to_id(BOS).unwrap();
    assert_eq!(tok.encode("hello world", true).unwrap()[0], bos);
    assert_ne!(tok.encode("hello world", false).unwrap()[0], bos);
    let prompt = tok
        .apply_chat_template(
            &[ChatMessage {
                role: "user".into(),
                content: "Hi there".into(),
            }],
            true,
        )
        .unwrap();
    assert_eq!(
        prompt,
        "<|begin_of_text|><|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids[0], bos, "the template supplies BOS");
    assert_eq!(ids.iter().filter(|i| **i == bos).count(), 1);
}

#[test]
fn word_ids_decode_to_words() {
    let tok = Tokenizer::builtin();
    assert!(tok.word_ids().len() > 500);
    for id in tok.word_ids().iter().take(50) {
        let t = tok.decode(&[*id], true).unwrap();
        assert!(t.starts_with(' '), "{t:?}");
    }
    assert!(tok.eos_id().is_some());
}

#[test]
fn committed_default_matches_a_fresh_training_run() {
    let (json, config) = train::train_default().unwrap();
    assert!(
        json == DEFAULT_TOKENIZER_JSON,
        "run `cargo xtask gen-tokenizer` and commit the result"
    );
    assert_eq!(config, DEFAULT_TOKENIZER_CONFIG);
    assert!(json.len() < 1_000_000, "{} bytes", json.len());
}

#[test]
fn bad_files_are_clear_errors() {
    let err = Tokenizer::from_parts("{not json", None, "x/tokenizer.json").unwrap_err();
    assert!(err.to_string().starts_with("x/tokenizer.json:"), "{err}");
    let err = Tokenizer::from_parts(DEFAULT_TOKENIZER_JSON, Some("[1"), "x").unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
    let bad_template = r#"{"chat_template": "{% for %}"}"#;
    assert!(Tokenizer::from_parts(DEFAULT_TOKENIZER_JSON, Some(bad_template), "x").is_err());
    let no_template = Tokenizer::from_parts(DEFAULT_TOKENIZER_JSON, None, "x").unwrap();
    assert!(matches!(
        no_template.apply_chat_template(&[], true),
        Err(Error::NoChatTemplate)
    ));
}

#[test]
fn added_tokens_decoder_is_merged() {
    let config =
        r#"{"added_tokens_decoder": {"6000": {"content": "<tool_call>", "special": true}}}"#;
    let tok = Tokenizer::from_parts(DEFAULT_TOKENIZER_JSON, Some(config), "x").unwrap();
    let ids = tok.encode("a <tool_call> b", false).unwrap();
    assert!(ids.contains(&tok.inner.token_to_id("<tool_call>").unwrap()));
}

/// A scratch directory under the system temp dir, emptied first; the caller removes it.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("warmpath-tokenizer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn chat_template_files_beside_the_config_take_its_place() {
    // transformers saves templates as files (chat_template.jinja, additional_chat_templates/
    // NAME.jinja) and, loading the directory, uses them over the config's `chat_template`.
    let dir = scratch_dir("template-files");
    std::fs::write(dir.join("tokenizer.json"), DEFAULT_TOKENIZER_JSON).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "CONFIG", "eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    let chat = |tools: Option<&str>| {
        Chat::from_json(
            ChatJson {
                messages: r#"[{"role": "user", "content": "hi"}]"#,
                tools,
                documents: None,
                chat_template_kwargs: None,
            },
            true,
        )
        .unwrap()
    };
    let tools = r#"[{"type": "function", "function": {"name": "f"}}]"#;
    let render = |tools| {
        Tokenizer::from_dir(&dir)
            .unwrap()
            .render_chat(&chat(tools))
            .unwrap()
    };
    assert_eq!(render(None), "CONFIG");
    std::fs::write(
        dir.join("chat_template.jinja"),
        "FILE{{ messages | length }}{{ eos_token }}",
    )
    .unwrap();
    assert_eq!(render(None), "FILE1<|im_end|>");
    assert_eq!(render(Some(tools)), "FILE1<|im_end|>");
    // A named tool_use template: the request with tools gets it.
    std::fs::create_dir(dir.join("additional_chat_templates")).unwrap();
    std::fs::write(
        dir.join("additional_chat_templates/tool_use.jinja"),
        "TOOLS{{ tools | length }}",
    )
    .unwrap();
    std::fs::write(
        dir.join("additional_chat_templates/notes.txt"),
        "not a template",
    )
    .unwrap();
    assert_eq!(render(None), "FILE1<|im_end|>");
    assert_eq!(render(Some(tools)), "TOOLS1");
    // No tokenizer_config.json at all: the files alone.
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    assert_eq!(render(None), "FILE1");
    // A template file that does not compile is the load's error.
    std::fs::write(dir.join("chat_template.jinja"), "{% for %}").unwrap();
    assert!(Tokenizer::from_dir(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
