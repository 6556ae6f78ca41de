//! Python's `str()` and `repr()` of template values, as jinja2 prints them: `{{ tools }}` and
//! `{{ tool | string }}` write a dict as `{'type': 'function', ...}` (single quotes, `None`,
//! `True`), not JSON. A few published templates print tools this way (Apriel 1.5 and 1.6).
//!
//! `repr(str)`: single quotes, or double quotes when the text has a single quote and no
//! double one; `\\`, the quote, `\t`, `\n`, `\r` escaped; a character Python does not print
//! (control and format characters, private use, surrogates, separators but the ASCII space)
//! as `\xhh`, `\uhhhh` or `\Uhhhhhhhh`; everything else, non-ASCII included, as it is.

use std::fmt::Write as _;

use minijinja::{Value, value::ValueKind};
use unicode_categories::UnicodeCategories;

use super::pyjson;

/// Containers nested deeper than this print as `...`, as a bound on recursion.
const MAX_DEPTH: usize = 256;

/// Python's `str(value)`: a string itself, an undefined value empty (jinja2's `Undefined`),
/// anything else its `repr`.
pub fn str_of(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            repr(&mut out, value, 0);
            out
        }
    }
}

fn repr(out: &mut String, v: &Value, depth: usize) {
    if depth > MAX_DEPTH {
        out.push_str("...");
        return;
    }
    match v.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Undefined => {}
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if !v.is_integer() => match f64::try_from(v.clone()) {
            Ok(f) => out.push_str(&float(f)),
            Err(_) => out.push_str(&v.to_string()),
        },
        ValueKind::String => string(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(out, &item, depth + 1);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(out, &key, depth + 1);
                out.push_str(": ");
                repr(out, &v.get_item(&key).unwrap_or_default(), depth + 1);
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// `repr(float)`: Python's shortest round trip, `nan`, `inf`, `-inf`.
fn float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        pyjson::float_repr(f)
    }
}

fn string(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if printable(c) => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character: not Other (Cc, Cf, Co, Cs) nor Separator
/// (Zs, Zl, Zp) but the ASCII space. (Unassigned code points, Cn, print here.)
fn printable(c: char) -> bool {
    c == ' '
        || !(c.is_other_control()
            || c.is_other_format()
            || c.is_other_private_use()
            || c.is_separator())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Value {
        Value::from_serialize(serde_json::from_str::<serde_json::Value>(json).unwrap())
    }

    #[test]
    fn containers_print_as_python_prints_them() {
        // Python: str({"type": "function", "n": 2, "x": 0.5, "ok": True, "none": None,
        //              "list": [1, "a", []]})
        // (Built member by member: the order is the client's, as the chat input keeps it.)
        let map = Value::from_iter([
            ("type", Value::from("function")),
            ("n", Value::from(2)),
            ("x", Value::from(0.5)),
            ("ok", Value::from(true)),
            ("none", Value::from(())),
            ("list", v(r#"[1, "a", []]"#)),
        ]);
        assert_eq!(
            str_of(&map),
            "{'type': 'function', 'n': 2, 'x': 0.5, 'ok': True, 'none': None, 'list': [1, 'a', []]}"
        );
        assert_eq!(str_of(&v("[1e16, 1.0, -0.0]")), "[1e+16, 1.0, -0.0]");
        // A string itself is printed as it is; inside a container, quoted.
        assert_eq!(str_of(&v(r#""it's""#)), "it's");
        assert_eq!(str_of(&Value::UNDEFINED), "");
    }

    #[test]
    fn strings_are_quoted_and_escaped_as_repr_does() {
        // Python: repr(s) for each s.
        let cases = [
            ("plain", "'plain'"),
            ("it's", "\"it's\""),
            ("both ' and \"", "'both \\' and \"'"),
            ("say \"hi\"", "'say \"hi\"'"),
            ("tab\tnl\ncr\rbs\\", "'tab\\tnl\\ncr\\rbs\\\\'"),
            ("bell\u{7}del\u{7f}", "'bell\\x07del\\x7f'"),
            ("nbsp\u{a0}zwsp\u{200b}", "'nbsp\\xa0zwsp\\u200b'"),
            ("ls\u{2028}pua\u{e000}", "'ls\\u2028pua\\ue000'"),
            ("Zürich 東京 🚀", "'Zürich 東京 🚀'"),
            ("tag\u{e0001}", "'tag\\U000e0001'"),
        ];
        for (s, want) in cases {
            let mut out = String::new();
            string(&mut out, s);
            assert_eq!(out, want, "{s:?}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let mut deep = Value::from(1);
        for _ in 0..(MAX_DEPTH + 10) {
            deep = Value::from(vec![deep]);
        }
        let s = str_of(&deep);
        assert!(s.contains("...") && s.len() < 4 * MAX_DEPTH, "{}", s.len());
    }
}
