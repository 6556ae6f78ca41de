//! vLLM's chat template content format, detected from the template's syntax tree as vLLM
//! detects it (`chat_utils._detect_content_format`): "openai" when a loop iterates a
//! message's `content` — a message being the variable of a loop over `messages`, or over a
//! variable set from it (`{% set loop_messages = messages[1:] %}`) — or iterates a variable
//! named `content`; else "string". In the "openai" format vLLM gives every message's content
//! to the template as a list of `{"type": "text", "text": ...}` parts (a string as one part),
//! which templates such as Gemma 4's, Mistral Small's, GLM's or Kimi K2's print differently.
//!
//! A template minijinja cannot parse is "string", as vLLM falls back when jinja2 cannot.
//! The tree is minijinja's (`unstable_machinery`), whose shapes map one to one onto jinja2's
//! nodes used here: `Var` (Name), `GetItem` with a constant / `GetAttr` (Getitem, Getattr),
//! `Slice` (Getitem with a slice), `Filter`, `Test`, `Set` (Assign), `ForLoop` (For).

use minijinja::machinery::{
    WhitespaceConfig,
    ast::{Expr, Stmt},
    parse,
};

/// Whether vLLM would render `source` with the "openai" content format.
pub fn is_openai(source: &str) -> bool {
    let Ok(root) = parse(
        source,
        "chat",
        Default::default(),
        WhitespaceConfig::default(),
    ) else {
        return false;
    };
    let mut nodes = Nodes::default();
    nodes.walk(&root);
    // vLLM asserts that each target it follows is one name; where one is not (`set ns.x =
    // messages`, `for i, m in messages`), the assertion fails and it falls back to "string".
    // Variables holding `messages` or its elements, widened through `set` until none is new.
    let mut names: Vec<&str> = vec!["messages"];
    let mut i = 0;
    while i < names.len() {
        for (target, value) in &nodes.sets {
            if reads(value, names[i], None) {
                match target {
                    None => return false,
                    Some(t) if !names.contains(t) => names.push(t),
                    Some(_) => {}
                }
            }
        }
        i += 1;
    }
    let mut items: Vec<&str> = Vec::new();
    for (target, iter) in &nodes.loops {
        if names.iter().any(|n| reads(iter, n, None)) {
            match target {
                None => return false,
                Some(t) => items.push(t),
            }
        }
    }
    // The first loop over a message's content (or over `content`) decides, in template order.
    for (target, iter) in &nodes.loops {
        if items.iter().any(|m| reads(iter, m, Some("content")))
            || matches!(iter, Expr::Var(v) if v.id == "content")
        {
            return target.is_some();
        }
    }
    false
}

/// Every `set NAME = EXPR` and every `for TARGET in ITER` of a template, wherever they are.
#[derive(Default)]
struct Nodes<'n, 's> {
    /// The variable set when it is one name (not `ns.attr`), and its value.
    sets: Vec<(Option<&'s str>, &'n Expr<'s>)>,
    /// The loop variable when it is one name (not a tuple), and what the loop iterates.
    loops: Vec<(Option<&'s str>, &'n Expr<'s>)>,
}

impl<'n, 's> Nodes<'n, 's> {
    fn walk(&mut self, stmt: &'n Stmt<'s>) {
        match stmt {
            Stmt::Template(t) => self.walk_all(&t.children),
            Stmt::ForLoop(f) => {
                self.loops.push((name_of(&f.target), &f.iter));
                self.walk_all(&f.body);
                self.walk_all(&f.else_body);
            }
            Stmt::IfCond(c) => {
                self.walk_all(&c.true_body);
                self.walk_all(&c.false_body);
            }
            Stmt::WithBlock(w) => self.walk_all(&w.body),
            Stmt::Set(s) => self.sets.push((name_of(&s.target), &s.expr)),
            Stmt::SetBlock(s) => self.walk_all(&s.body),
            Stmt::AutoEscape(a) => self.walk_all(&a.body),
            Stmt::FilterBlock(f) => self.walk_all(&f.body),
            Stmt::Block(b) => self.walk_all(&b.body),
            Stmt::Macro(m) => self.walk_all(&m.body),
            Stmt::CallBlock(c) => self.walk_all(&c.macro_decl.body),
            _ => {}
        }
    }

    fn walk_all(&mut self, stmts: &'n [Stmt<'s>]) {
        for s in stmts {
            self.walk(s);
        }
    }
}

/// The name a `set` or `for` target is, when it is one (not `ns.attr`, not a tuple).
fn name_of<'s>(target: &Expr<'s>) -> Option<&'s str> {
    match target {
        Expr::Var(v) => Some(v.id),
        _ => None,
    }
}

/// `name` — or with `key`, `name[key]` / `name.key` — possibly sliced, filtered or tested
/// (vLLM's `_is_var_or_elems_access`).
fn reads(expr: &Expr<'_>, name: &str, key: Option<&str>) -> bool {
    match expr {
        Expr::Filter(f) => f.expr.as_ref().is_some_and(|e| reads(e, name, key)),
        Expr::Test(t) => reads(&t.expr, name, key),
        Expr::Slice(s) => reads(&s.expr, name, key),
        Expr::Var(v) => key.is_none() && v.id == name,
        Expr::GetAttr(a) => key == Some(a.name) && matches!(&a.expr, Expr::Var(v) if v.id == name),
        Expr::GetItem(i) => {
            key.is_some_and(
                |k| matches!(&i.subscript_expr, Expr::Const(c) if c.value.as_str() == Some(k)),
            ) && matches!(&i.expr, Expr::Var(v) if v.id == name)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_over_a_message_content_are_the_openai_format() {
        // Written to vLLM's rules (chat_utils `_detect_content_format`), each case by hand.
        let openai = [
            "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
            "{% for m in messages %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}",
            "{% set rest = messages[1:] %}{% for m in rest %}{% for p in m.content | list %}{% endfor %}{% endfor %}",
            "{% set a = messages %}{% set b = a %}{% for m in b %}{% if m.content is string %}{% else %}{% for p in m['content'] %}{% endfor %}{% endif %}{% endfor %}",
            "{% macro show(content) %}{% for item in content %}{{ item }}{% endfor %}{% endmacro %}",
        ];
        for t in openai {
            assert!(is_openai(t), "{t}");
        }
        let string = [
            "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            // A loop over content of something that is not a message.
            "{% for p in tools['content'] %}{% endfor %}{% for m in messages %}{% endfor %}",
            // Targets that are not one name where vLLM follows one: its assertion fails and
            // it falls back to "string".
            "{% for i, m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}",
            "{% set ns = namespace() %}{% set ns.x = messages %}{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}",
            "{% for m in messages %}{% for k, v in m.content %}{% endfor %}{% endfor %}",
            "{% for a, b in content %}{% endfor %}",
            // `messages` through a call is not followed (vLLM does not either).
            "{% for m in messages.items() %}{% for p in m.content %}{% endfor %}{% endfor %}",
            "{% for %}",
        ];
        for t in string {
            assert!(!is_openai(t), "{t}");
        }
    }
}
