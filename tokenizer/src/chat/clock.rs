//! `strftime_now(format)` as transformers defines it for chat templates:
//! `datetime.now().strftime(format)` — the local wall-clock time, naive (no zone), formatted
//! with the C `strftime` directives (`%d %b %Y` in Llama 3.x templates).
//!
//! The directives are jiff's strftime, which follows C's: `%Y %m %d %b %B %a %A %H %I %M %S
//! %p %y %j %e %%` and the rest, with English names as in the C locale. A naive Python
//! `datetime` prints `%z` and `%Z` as empty strings; so does this.
//!
//! The clock is injectable so that renders can be reproduced: [`ChatClock::Fixed`] (tests), or
//! the environment variable [`NOW_ENV`] for a whole process (`2024-07-26T09:05:00`).

use jiff::civil::DateTime;

use crate::Error;

/// Environment variable that fixes `strftime_now`'s time for every tokenizer loaded after it
/// is set (a civil date-time, `YYYY-MM-DDTHH:MM:SS`): reproducible prompts in tests and
/// benchmarks that compare a router's tokens with an engine's across midnight.
pub const NOW_ENV: &str = "WARMPATH_CHAT_TEMPLATE_NOW";

/// Where `strftime_now` reads the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChatClock {
    /// The system's local time (time zone from `TZ` or `/etc/localtime`; UTC if unknown).
    #[default]
    Local,
    /// Always this wall-clock time.
    Fixed(DateTime),
}

impl ChatClock {
    /// A fixed clock from `YYYY-MM-DDTHH:MM:SS`.
    pub fn fixed(at: &str) -> Result<Self, Error> {
        at.parse::<DateTime>()
            .map(ChatClock::Fixed)
            .map_err(|e| Error::Template(format!("strftime_now clock {at:?}: {e}")))
    }

    /// [`NOW_ENV`] when set, else the local clock.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(NOW_ENV) {
            Ok(at) => Self::fixed(&at).map_err(|e| Error::Template(format!("{NOW_ENV}: {e}"))),
            Err(_) => Ok(ChatClock::Local),
        }
    }

    fn now(&self) -> DateTime {
        match self {
            ChatClock::Local => jiff::Zoned::now().datetime(),
            ChatClock::Fixed(at) => *at,
        }
    }

    /// `datetime.now().strftime(format)`.
    pub fn strftime_now(&self, format: &str) -> Result<String, Error> {
        strftime(self.now(), format)
    }
}

/// `format` applied to a naive date-time as Python does (`%z`/`%Z` empty).
fn strftime(at: DateTime, format: &str) -> Result<String, Error> {
    let mut naive = String::with_capacity(format.len());
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            naive.push(c);
            continue;
        }
        match chars.peek() {
            Some('z' | 'Z') => {
                chars.next();
            }
            Some('%') => {
                chars.next();
                naive.push_str("%%");
            }
            _ => naive.push('%'),
        }
    }
    jiff::fmt::strtime::format(naive.as_bytes(), at)
        .map_err(|e| Error::Template(format!("strftime_now({format:?}): {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected strings are Python 3.11's `datetime(2024, 7, 6, 15, 4, 5).strftime(...)`.
    #[test]
    fn directives_print_as_python_strftime() {
        let clock = ChatClock::fixed("2024-07-06T15:04:05").unwrap();
        for (format, want) in [
            ("%d %b %Y", "06 Jul 2024"),
            ("%Y-%m-%d %H:%M:%S", "2024-07-06 15:04:05"),
            ("%A %a %B %b", "Saturday Sat July Jul"),
            ("%I %p %y %j", "03 PM 24 188"),
            ("100%% at %H%z%Z", "100% at 15"),
            ("%e|%-d", " 6|6"),
        ] {
            assert_eq!(clock.strftime_now(format).unwrap(), want, "{format}");
        }
        assert!(clock.strftime_now("%Q").is_err());
        assert!(ChatClock::fixed("July").is_err());
        assert_ne!(
            ChatClock::Local.strftime_now("%Y").unwrap(),
            "",
            "the local clock answers"
        );
    }
}
