//! Server-sent events split out of a byte stream (`text/event-stream`, as engines stream
//! completions): events end at a blank line, `\n\n` or `\r\n\r\n` (or the mixed `\n\r\n`).
//!
//! Two levels, both without copying what they can share:
//!
//! - [`events`] iterates the complete events of a buffer as slices ([`Event`]): no
//!   allocation, for readers that already hold whole events.
//! - [`Splitter`] takes a stream's reads one by one ([`Splitter::push`]) and hands back the
//!   complete events each read finishes, carrying an incomplete event over to the next read.
//!   A read that ends on an event boundary with nothing carried over is handed back as it
//!   came (the same `Bytes`, no copy). What is carried over is bounded: an event longer than
//!   the splitter's limit ends the splitting, and the rest of the stream passes through as
//!   [`Piece::Raw`].
//!
//! ```
//! use bytes::Bytes;
//! use warmpath_agent::http::sse::{Piece, Splitter, events};
//!
//! let mut split = Splitter::new(1024);
//! assert_eq!(split.push(Bytes::from_static(b"data: 1\r\n\r\ndata: ")), Piece::Events(Bytes::from_static(b"data: 1\r\n\r\n")));
//! let Piece::Events(done) = split.push(Bytes::from_static(b"2\n\n")) else { unreachable!() };
//! let bodies: Vec<&[u8]> = events(&done).map(|e| e.body).collect();
//! assert_eq!(bodies, [&b"data: 2"[..]]);
//! ```

use bytes::{Bytes, BytesMut};

/// The longest incomplete event a reader should carry over by default: vLLM's largest
/// chunks (a final usage event, a long logprobs list) are far below it.
pub const DEFAULT_MAX_EVENT: usize = 1024 * 1024;

/// One event of a buffer: its lines, and the blank line that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The event's lines, without the terminator (`data: {...}`).
    pub body: &'a [u8],
    /// The line break(s) that ended it: `\n\n`, `\r\n\r\n` or `\n\r\n`.
    pub terminator: &'a [u8],
}

/// The complete events at the front of `buf`, in order; bytes after the last complete event
/// are not yielded (see [`Events::rest`]).
pub fn events(buf: &[u8]) -> Events<'_> {
    Events { buf, at: 0 }
}

/// Iterator over the complete events of a buffer (see [`events`]).
#[derive(Debug, Clone)]
pub struct Events<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Events<'a> {
    /// What follows the events yielded so far (after the last one: an incomplete event).
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.at..]
    }
}

impl<'a> Iterator for Events<'a> {
    type Item = Event<'a>;

    fn next(&mut self) -> Option<Event<'a>> {
        let rest = &self.buf[self.at..];
        let (start, end) = first_end(rest)?;
        self.at += end;
        Some(Event {
            body: &rest[..start],
            terminator: &rest[start..end],
        })
    }
}

/// Where the first event terminator in `buf` starts and ends.
fn first_end(buf: &[u8]) -> Option<(usize, usize)> {
    for i in memchr::memchr_iter(b'\n', buf) {
        let after = &buf[i + 1..];
        let len = if after.first() == Some(&b'\n') {
            2
        } else if after.starts_with(b"\r\n") {
            3
        } else {
            continue;
        };
        // `\r\n\r\n`: the terminator starts at the first line's `\r`.
        let start = if i > 0 && buf[i - 1] == b'\r' && len == 3 {
            i - 1
        } else {
            i
        };
        return Some((start, i + len));
    }
    None
}

/// Where the last complete event in `buf` ends (the length of the prefix of whole events).
pub fn complete_len(buf: &[u8]) -> Option<usize> {
    memchr::memrchr_iter(b'\n', buf).find_map(|j| {
        let before = &buf[..j];
        (before.ends_with(b"\n") || before.ends_with(b"\n\r")).then_some(j + 1)
    })
}

/// Whether `buf` ends on an event boundary (its last bytes are a terminator).
pub fn ends_event(buf: &[u8]) -> bool {
    buf.ends_with(b"\n\n") || buf.ends_with(b"\n\r\n")
}

/// What one read gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Whole events (possibly none yet: empty), to be read with [`events`].
    Events(Bytes),
    /// Bytes passed through unsplit: an event outgrew the limit, and the splitter gave up.
    Raw(Bytes),
}

/// Splits a stream's reads into whole events, carrying an incomplete event over (at most
/// `max_event` bytes of it).
#[derive(Debug)]
pub struct Splitter {
    pending: BytesMut,
    max_event: usize,
    gave_up: bool,
}

impl Splitter {
    /// A splitter that carries at most `max_event` bytes of an incomplete event.
    pub fn new(max_event: usize) -> Self {
        Self {
            pending: BytesMut::new(),
            max_event,
            gave_up: false,
        }
    }

    /// Takes one read: the events it completes (with any carried over before them), or the
    /// bytes themselves once the splitter gave up.
    pub fn push(&mut self, data: Bytes) -> Piece {
        if self.gave_up {
            return Piece::Raw(data);
        }
        // The common case: whole events in one read, nothing carried: handed back as is.
        if self.pending.is_empty() && ends_event(&data) {
            return Piece::Events(data);
        }
        self.pending.extend_from_slice(&data);
        match complete_len(&self.pending) {
            Some(end) => Piece::Events(self.pending.split_to(end).freeze()),
            None if self.pending.len() > self.max_event => {
                self.gave_up = true;
                Piece::Raw(self.pending.split().freeze())
            }
            None => Piece::Events(Bytes::new()),
        }
    }

    /// At the end of the stream: what was still carried over (an unterminated event).
    pub fn finish(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// Drops what is carried over (the stream is being ended another way).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// Bytes carried over now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether an oversized event ended the splitting.
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(buf: &[u8]) -> Vec<&[u8]> {
        events(buf).map(|e| e.body).collect()
    }

    #[test]
    fn both_line_endings_end_events() {
        let buf = b"data: a\n\ndata: b\r\n\r\nid: 1\ndata: c\n\r\ndata: partial\n";
        assert_eq!(
            bodies(buf),
            [&b"data: a"[..], b"data: b", b"id: 1\ndata: c"]
        );
        let terms: Vec<&[u8]> = events(buf).map(|e| e.terminator).collect();
        assert_eq!(terms, [&b"\n\n"[..], b"\r\n\r\n", b"\n\r\n"]);
        let mut it = events(buf);
        it.by_ref().for_each(drop);
        assert_eq!(it.rest(), b"data: partial\n");
        assert_eq!(
            complete_len(buf),
            Some(buf.len() - b"data: partial\n".len())
        );
        assert_eq!(complete_len(b"data: x\r\n"), None);
        assert!(ends_event(b"x\r\n\r\n") && ends_event(b"x\n\n") && !ends_event(b"x\r\n"));
    }

    #[test]
    fn events_split_across_reads_come_out_whole_at_any_split() {
        let stream = b"data: one\r\n\r\ndata: two\n\ndata: three\r\n\r\n";
        for split in 1..stream.len() {
            let mut s = Splitter::new(1024);
            let mut out = Vec::new();
            for chunk in stream.chunks(split) {
                let Piece::Events(done) = s.push(Bytes::copy_from_slice(chunk)) else {
                    panic!("gave up at split {split}");
                };
                out.extend(bodies(&done).into_iter().map(<[u8]>::to_vec));
            }
            assert_eq!(out, [&b"data: one"[..], b"data: two", b"data: three"]);
            assert!(s.finish().is_empty());
        }
    }

    #[test]
    fn whole_reads_are_not_copied_and_oversized_events_pass_through() {
        let mut s = Splitter::new(8);
        let read = Bytes::from_static(b"data: 1\n\n");
        let Piece::Events(same) = s.push(read.clone()) else {
            panic!("split");
        };
        assert_eq!(same.as_ptr(), read.as_ptr());
        assert_eq!(
            s.push(Bytes::from_static(b"data:")),
            Piece::Events(Bytes::new())
        );
        assert_eq!(s.pending(), 5);
        assert_eq!(
            s.push(Bytes::from_static(b" long")),
            Piece::Raw(Bytes::from_static(b"data: long"))
        );
        assert!(s.gave_up() && s.pending() == 0);
        assert_eq!(
            s.push(Bytes::from_static(b"\n\n")),
            Piece::Raw(Bytes::from_static(b"\n\n"))
        );
    }
}
