//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`,
//! not minijinja's built-in (which escapes HTML characters and writes `,`/`:` without spaces).
//!
//! What Python's encoder does, and so what this does:
//! - separators `", "` and `": "` by default, `","` and `": "` when `indent` is given;
//! - `indent` an int (that many spaces; 0 or less: newlines only) or a string; empty lists and
//!   objects stay `[]` and `{}`;
//! - strings escape `"`, `\`, `\n`, `\r`, `\t`, `\b`, `\f` and other controls as `\u00XX`
//!   (lower-case hex); with `ensure_ascii`, every non-ASCII character as `\uXXXX` (surrogate
//!   pairs above the BMP);
//! - floats as Python's `repr` (`1.0`, `1e-05`, `1.5e+16`), `NaN`, `Infinity`, `-Infinity`;
//! - object keys in insertion order (or sorted with `sort_keys`), non-string keys converted as
//!   Python converts them (`1` -> `"1"`, `true` -> `"true"`, `none` -> `"null"`);
//! - undefined values, bytes and plain objects are not serializable (an error, as `TypeError`).

use std::fmt::Write as _;

use minijinja::{Error, ErrorKind, Value, value::Kwargs, value::ValueKind};

/// Python `json.dumps` options.
#[derive(Debug, Clone)]
pub(super) struct Options {
    pub ensure_ascii: bool,
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Options {
    /// From the filter's arguments, in transformers' parameter order
    /// `(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, positional or named.
    pub fn from_args(positional: &[Value], kwargs: &Kwargs) -> Result<Self, Error> {
        let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
        if positional.len() > names.len() {
            return Err(invalid(format!(
                "tojson() takes at most {} arguments after the value",
                names.len()
            )));
        }
        let mut args: [Value; 4] = Default::default();
        for (slot, (name, given)) in args.iter_mut().zip(
            names
                .iter()
                .zip(positional.iter().map(Some).chain(std::iter::repeat(None))),
        ) {
            let named: Option<Value> = kwargs.get(name)?;
            *slot = match (given, named) {
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "tojson() got multiple values for argument '{name}'"
                    )));
                }
                (Some(v), None) => v.clone(),
                (None, Some(v)) => v,
                (None, None) => Value::UNDEFINED,
            };
        }
        let [ensure_ascii, indent, separators, sort_keys] = args;
        let indent = match indent.kind() {
            ValueKind::Undefined | ValueKind::None => None,
            ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
            ValueKind::Bool => Some(if indent.is_true() { " " } else { "" }.to_string()),
            ValueKind::Number if indent.is_integer() => {
                let n = indent.as_i64().unwrap_or(0).clamp(0, 64);
                Some(" ".repeat(n as usize))
            }
            _ => {
                return Err(invalid(format!(
                    "tojson(): indent must be an int or a string, not {}",
                    indent.kind()
                )));
            }
        };
        let (item_sep, key_sep) = match separators.kind() {
            ValueKind::Undefined | ValueKind::None if indent.is_some() => (",".into(), ": ".into()),
            ValueKind::Undefined | ValueKind::None => (", ".into(), ": ".into()),
            ValueKind::Seq if separators.len() == Some(2) => {
                let part = |i: usize| -> Result<String, Error> {
                    let v = separators.get_item_by_index(i)?;
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid("tojson(): separators must be two strings"))
                };
                (part(0)?, part(1)?)
            }
            _ => return Err(invalid("tojson(): separators must be a pair of strings")),
        };
        Ok(Self {
            ensure_ascii: ensure_ascii.is_true(),
            indent,
            item_sep,
            key_sep,
            sort_keys: sort_keys.is_true(),
        })
    }
}

impl Default for Options {
    /// `json.dumps(x)` with transformers' `ensure_ascii=False`.
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Nesting beyond which a value is refused (Python's own limit is the recursion limit, 1000).
const MAX_DEPTH: usize = 512;

/// `json.dumps(value, ...)` as Python writes it.
pub(super) fn dumps(value: &Value, options: &Options) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

fn not_serializable(value: &Value) -> Error {
    let kind = match value.kind() {
        ValueKind::Undefined => "Undefined".to_string(),
        other => other.to_string(),
    };
    invalid(format!("Object of type {kind} is not JSON serializable"))
}

fn write_value(out: &mut String, v: &Value, o: &Options, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(invalid("tojson(): value nested too deeply"));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, &items, '[', ']', o, depth, |out, item, o, depth| {
                write_value(out, item, o, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(Value, Value)> = Vec::new();
            for key in v.try_iter()? {
                let val = v.get_item(&key)?;
                entries.push((key, val));
            }
            if o.sort_keys {
                sort_entries(&mut entries)?;
            }
            write_container(
                out,
                &entries,
                '{',
                '}',
                o,
                depth,
                |out, (k, val), o, depth| {
                    write_key(out, k, o)?;
                    out.push_str(&o.key_sep);
                    write_value(out, val, o, depth)
                },
            )?;
        }
        ValueKind::Undefined | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(not_serializable(v));
        }
        // A kind added to minijinja later: refuse it rather than guess.
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    items: &[T],
    open: char,
    close: char,
    o: &Options,
    depth: usize,
    mut each: impl FnMut(&mut String, &T, &Options, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &o.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    newline(out, depth + 1);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&o.item_sep);
            newline(out, depth + 1);
        }
        each(out, item, o, depth + 1)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python sorts `dict.items()`: keys of one kind only (strings, or numbers).
fn sort_entries(entries: &mut [(Value, Value)]) -> Result<(), Error> {
    let all = |kind: ValueKind| entries.iter().all(|(k, _)| k.kind() == kind);
    if all(ValueKind::String) {
        entries.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
    } else if all(ValueKind::Number) {
        entries.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    } else if entries.len() > 1 {
        return Err(invalid(
            "tojson(sort_keys=true): '<' not supported between keys of different types",
        ));
    }
    Ok(())
}

fn write_key(out: &mut String, k: &Value, o: &Options) -> Result<(), Error> {
    match k.kind() {
        ValueKind::String => write_string(out, k.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, k);
            write_string(out, &s, false);
        }
        ValueKind::Bool => out.push_str(if k.is_true() { "\"true\"" } else { "\"false\"" }),
        ValueKind::None => out.push_str("\"null\""),
        _ => {
            return Err(invalid(format!(
                "keys must be str, int, float, bool or None, not {}",
                k.kind()
            )));
        }
    }
    Ok(())
}

fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        // i64, u64 and the 128-bit integers minijinja keeps all print as decimal digits.
        let _ = write!(out, "{v}");
        return;
    }
    match f64::try_from(v.clone()) {
        Ok(f) => out.push_str(&float_repr(f)),
        Err(_) => {
            let _ = write!(out, "{v}");
        }
    }
}

/// Python's `float.__repr__` (`json` writes floats with it): the shortest digits that read
/// back the same, in fixed notation when the decimal exponent is in `-5 < e < 16`, otherwise
/// `d.ddde+XX`; `.0` added to integral values.
pub(super) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if !(-5 < exp && exp < 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        return out;
    }
    // Fixed notation: the point after `exp + 1` digits.
    let point = exp + 1;
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(&digits);
    } else {
        let point = point as usize;
        if digits.len() <= point {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    }
    out
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected strings are Python 3.11's `repr(float)` / `json.dumps` output, typed in.
    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e300, "1e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn dumps_matches_python_json() {
        let v: Value = serde_json::from_str(
            r#"{"b": [1, 2.5, true, null], "a": "é\"\n\u0001", "c": {}, "d": []}"#,
        )
        .unwrap();
        assert_eq!(
            dumps(&v, &Options::default()).unwrap(),
            r#"{"b": [1, 2.5, true, null], "a": "é\"\n\u0001", "c": {}, "d": []}"#
        );
        let indented = Options {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            sort_keys: true,
            ensure_ascii: true,
            ..Options::default()
        };
        assert_eq!(
            dumps(&v, &indented).unwrap(),
            "{\n  \"a\": \"\\u00e9\\\"\\n\\u0001\",\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"c\": {},\n  \"d\": []\n}"
        );
        let astral = Value::from("😀");
        let ascii = Options {
            ensure_ascii: true,
            ..Options::default()
        };
        assert_eq!(dumps(&astral, &ascii).unwrap(), r#""\ud83d\ude00""#);
        assert!(dumps(&Value::UNDEFINED, &Options::default()).is_err());
    }
}
