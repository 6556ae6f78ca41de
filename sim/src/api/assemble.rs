//! Turning the engine's token stream into text, honouring stop strings.
//!
//! Like vLLM's detokenizer: when a stop string appears the text is cut before it and the
//! request ends with finish_reason "stop" and stop_reason = that string. While streaming,
//! text that could still become the start of a stop string is held back.

/// Accumulated output of one request.
#[derive(Debug, Default)]
pub struct Assembler {
    stops: Vec<String>,
    /// Stop strings are looked for only after this many tokens (`min_tokens`, as vLLM's
    /// detokenizer checks them only past it).
    min_tokens: usize,
    /// Keep the matched stop string at the end of the text (`include_stop_str_in_output`).
    include_stop: bool,
    hold: usize,
    text: String,
    emitted: usize,
    pub tokens: usize,
    pub stopped_by: Option<String>,
}

impl Assembler {
    pub fn new(stops: Vec<String>, min_tokens: usize, include_stop: bool) -> Self {
        let hold = stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        Self {
            stops,
            min_tokens,
            include_stop,
            hold,
            ..Default::default()
        }
    }

    /// Appends one token's text; returns the text that may be shown now. After a stop string
    /// matched, `stopped_by` is set and further pushes are ignored.
    pub fn push(&mut self, piece: &str) -> &str {
        if self.stopped_by.is_some() {
            return "";
        }
        self.tokens += 1;
        let search_from = self.emitted;
        self.text.push_str(piece);
        let checked = if self.tokens > self.min_tokens {
            &self.stops[..]
        } else {
            &[]
        };
        let found = checked
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|p| (search_from + p, s))
            })
            .min_by_key(|(p, _)| *p);
        let end = match found {
            Some((pos, stop)) => {
                let end = if self.include_stop {
                    pos + stop.len()
                } else {
                    pos
                };
                self.stopped_by = Some(stop.clone());
                self.text.truncate(end);
                end
            }
            None => floor_char_boundary(&self.text, self.text.len().saturating_sub(self.hold))
                .max(self.emitted),
        };
        let start = self.emitted;
        self.emitted = end;
        &self.text[start..end]
    }

    /// Releases held-back text at the end of generation.
    pub fn flush(&mut self) -> &str {
        let start = self.emitted;
        self.emitted = self.text.len();
        &self.text[start..]
    }

    /// Everything generated (after the stop cut).
    pub fn text(&self) -> &str {
        &self.text
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_across_tokens_is_cut_and_never_shown() {
        let mut a = Assembler::new(vec!["END".into()], 0, false);
        let mut shown = String::new();
        for piece in [" hello", " E", "N", "D and more"] {
            shown.push_str(a.push(piece));
        }
        assert_eq!(a.stopped_by.as_deref(), Some("END"));
        assert_eq!(a.text(), " hello ");
        shown.push_str(a.flush());
        assert_eq!(shown, " hello ");
        assert_eq!(a.tokens, 4);
    }

    #[test]
    fn stop_strings_count_only_after_min_tokens() {
        // vLLM checks stop strings once more than min_tokens tokens are out: "END" in the
        // second token is text, in the fourth it stops.
        let mut a = Assembler::new(vec!["END".into()], 2, false);
        for piece in [" a", " END", " b", " END", " c"] {
            a.push(piece);
        }
        assert_eq!(a.stopped_by.as_deref(), Some("END"));
        assert_eq!(a.text(), " a END b ");
        assert_eq!(a.tokens, 4);
    }

    #[test]
    fn include_stop_str_in_output_keeps_the_stop_string() {
        let mut a = Assembler::new(vec!["END".into()], 0, true);
        let mut shown = String::new();
        for piece in [" hello", " E", "N", "D and more"] {
            shown.push_str(a.push(piece));
        }
        shown.push_str(a.flush());
        assert_eq!((a.text(), shown.as_str()), (" hello END", " hello END"));
        assert_eq!(a.stopped_by.as_deref(), Some("END"));
    }

    #[test]
    fn without_stops_everything_streams_immediately() {
        let mut a = Assembler::new(vec![], 0, false);
        assert_eq!(a.push(" one"), " one");
        assert_eq!(a.push(" two"), " two");
        assert_eq!(a.flush(), "");
    }
}
