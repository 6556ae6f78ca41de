//! Where a benchmark's logs go: `<out>/logs/<role>-<n>.log` for each process it starts
//! (stdout and stderr), `<out>/logs/bench.log` for its own tracing, so the terminal carries
//! only progress and the report. The tail of a log is what an error about its process shows.

use std::{
    collections::HashMap,
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::Error;

/// Lines of a log an error message quotes.
pub const TAIL_LINES: usize = 20;

/// Bytes read from the end of a log for its tail: enough for [`TAIL_LINES`] long lines, and
/// bounded however large the log has grown.
const TAIL_BYTES: u64 = 16 * 1024;

/// Default `RUST_LOG` of the bench's own log (the agent's default).
const DEFAULT_FILTER: &str = "info,zeromq=warn";

/// The output directory of a benchmark that writes only logs, when none is given:
/// `warmpath-bench/<bench>` in the system's temporary directory (each run overwrites it).
pub fn default_out(bench: &str) -> PathBuf {
    std::env::temp_dir().join("warmpath-bench").join(bench)
}

/// One run's log directory. Clones share the per-role counters.
#[derive(Debug, Clone)]
pub struct Logs {
    dir: PathBuf,
    next: Arc<Mutex<HashMap<String, usize>>>,
}

/// Where one process's output goes.
#[derive(Debug)]
pub struct LogFile {
    pub path: PathBuf,
    file: File,
}

// === impl Logs ===

impl Logs {
    /// `<out>/logs`, created if missing.
    pub fn create(out: &Path) -> Result<Self, Error> {
        let dir = out.join("logs");
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        Ok(Self {
            dir,
            next: Arc::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new, empty `<role>-<n>.log` for the next process of `role` (`n` counts from 0 per
    /// role within this run; a file of an earlier run with that name is truncated).
    pub fn open(&self, role: &str) -> Result<LogFile, Error> {
        let n = {
            // A poisoned counter map still holds valid counts (plain integers).
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let n = next.entry(role.to_string()).or_insert(0);
            *n += 1;
            *n - 1
        };
        let path = self.dir.join(format!("{}-{n}.log", file_name(role)));
        let file = File::create(&path).map_err(|source| Error::Io {
            what: format!("create {}", path.display()),
            source,
        })?;
        Ok(LogFile { path, file })
    }
}

/// `role` as a file name: lower case, anything but letters, digits, `-` and `_` as `-`.
fn file_name(role: &str) -> String {
    role.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

// === impl LogFile ===

impl LogFile {
    fn handle(&self) -> Result<File, Error> {
        self.file.try_clone().map_err(|source| Error::Io {
            what: format!("open {}", self.path.display()),
            source,
        })
    }

    /// A handle for a child's stdout or stderr.
    pub fn stdio(&self) -> Result<std::process::Stdio, Error> {
        self.handle().map(Into::into)
    }

    /// An async writer on the same file (for what the bench copies from a pipe).
    pub fn writer(&self) -> Result<tokio::fs::File, Error> {
        self.handle().map(tokio::fs::File::from_std)
    }

    /// `<role>-<n>`, the file's stem, to name its process in messages.
    pub fn name(&self) -> String {
        self.path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    }

    /// "; the end of its log <path>:" and its last lines, for an error about its process.
    pub fn quote(&self) -> String {
        quote(&self.path)
    }
}

/// The last [`TAIL_LINES`] lines of the log at `path`, introduced with the path.
pub fn quote(path: &Path) -> String {
    match tail(path, TAIL_LINES) {
        Ok(t) if t.is_empty() => format!("; its log {} is empty", path.display()),
        Ok(t) => format!("; the end of its log {}:\n{t}", path.display()),
        Err(e) => format!("; its log {} cannot be read: {e}", path.display()),
    }
}

/// The last `lines` lines of the file (read from at most its last [`TAIL_BYTES`]).
pub fn tail(path: &Path, lines: usize) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    // Peer routers colour their logs whatever NO_COLOR says: quote them as plain text.
    let text = console::strip_ansi_codes(&text);
    let mut all: Vec<&str> = text.lines().collect();
    // A cut first line is partial: drop it unless it is all there is.
    if from > 0 && all.len() > 1 {
        all.remove(0);
    }
    let keep = all.len().saturating_sub(lines);
    Ok(all[keep..].join("\n"))
}

/// This process's own tracing, written to a file rather than the terminal.
#[derive(Debug)]
pub struct BenchLog {
    pub path: PathBuf,
    /// Warnings and errors logged so far; `None` when another subscriber was installed
    /// first (the bench called from a test), which then gets the events instead.
    warnings: Option<Arc<AtomicUsize>>,
}

impl BenchLog {
    /// Installs the process-wide subscriber: `RUST_LOG` (default info) into `<logs>/bench.log`
    /// without colour codes, and a count of warnings for the summary.
    pub fn install(logs: &Logs) -> Result<Self, Error> {
        use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};
        let path = logs.dir().join("bench.log");
        let file = File::create(&path).map_err(|source| Error::Io {
            what: format!("create {}", path.display()),
            source,
        })?;
        let filter =
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
        let warnings = Arc::new(AtomicUsize::new(0));
        let installed = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(Mutex::new(file))
                    .with_filter(filter),
            )
            .with(CountWarnings(warnings.clone()))
            .try_init()
            .is_ok();
        Ok(Self {
            path,
            warnings: installed.then_some(warnings),
        })
    }

    /// "logs: <dir>" with the warnings this process logged, if any.
    pub fn summary(&self) -> String {
        let dir = self.path.parent().unwrap_or(&self.path);
        match self.warnings.as_ref().map(|w| w.load(Ordering::Relaxed)) {
            Some(0) | None => format!("logs: {}", dir.display()),
            Some(n) => format!(
                "logs: {} ({n} warning(s) in {})",
                dir.display(),
                self.path.display()
            ),
        }
    }
}

/// Counts events at WARN and above.
struct CountWarnings(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountWarnings {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("warmpath-bench-logs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn files_are_numbered_per_role() {
        let out = scratch("numbered");
        let logs = Logs::create(&out).unwrap();
        let files: Vec<LogFile> = [
            "agent-precise",
            "agent-precise",
            "sglang-router cache_aware",
        ]
        .iter()
        .map(|r| logs.open(r).unwrap())
        .collect();
        let dir = out.join("logs");
        let paths: Vec<&Path> = files.iter().map(|f| f.path.as_path()).collect();
        assert_eq!(
            paths,
            [
                dir.join("agent-precise-0.log"),
                dir.join("agent-precise-1.log"),
                dir.join("sglang-router-cache_aware-0.log"),
            ]
        );
        assert!(paths.iter().all(|p| p.is_file()));
        assert_eq!(files[1].name(), "agent-precise-1");
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn the_tail_is_the_last_lines() {
        let out = scratch("tail");
        std::fs::create_dir_all(&out).unwrap();
        let path = out.join("x.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(tail(&path, 3).unwrap(), "line 97\nline 98\nline 99");
        assert_eq!(tail(&path, 1000).unwrap().lines().count(), 100);
        std::fs::write(&path, "").unwrap();
        assert!(quote(&path).ends_with("is empty"), "{}", quote(&path));
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn the_tail_is_quoted_without_colour_codes() {
        let out = scratch("colour");
        std::fs::create_dir_all(&out).unwrap();
        let path = out.join("x.log");
        std::fs::write(
            &path,
            "\u{1b}[2m12:25:26\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m started\n",
        )
        .unwrap();
        assert_eq!(tail(&path, 5).unwrap(), "12:25:26  INFO started");
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn the_tail_of_a_large_log_reads_only_its_end() {
        let out = scratch("large");
        std::fs::create_dir_all(&out).unwrap();
        let path = out.join("x.log");
        // 1 MiB of one long line, then two short ones: the cut long line is dropped.
        let mut text = "x".repeat(1 << 20);
        text.push_str("\nsecond to last\nlast\n");
        std::fs::write(&path, text).unwrap();
        assert_eq!(tail(&path, 20).unwrap(), "second to last\nlast");
        std::fs::remove_dir_all(&out).unwrap();
    }
}
