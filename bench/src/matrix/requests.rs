//! `<out>/requests.jsonl`: every answered request of the matrix as its client saw it, one
//! JSON object a line — the cell (workload, load), the run and its seed, the row, and the
//! sample (sent at, TTFT, end to end, prompt / cached / output tokens, the route receipt,
//! the cost model's prediction, the chosen engine and the time it held the request when the
//! router sent them, and the chain — chat session, agent loop, RAG user — it was a turn of
//! as `session`, and in a `mix` cell the workload of that chain as `part`; `tenant` and
//! `step` are the load generator's and empty / 0 here). Times are wall seconds from the
//! run's start. What the table's quantiles are computed from, for reading one request at a
//! time (which were cold, when they waited); a failed request is counted in the table's
//! answered/sent, not here.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::workloads::Part;
use crate::{Error, run::report::Sample};

/// The open file; lines are written as each row's run ends.
pub struct Requests {
    path: PathBuf,
    out: BufWriter<File>,
}

/// Where one run of one row sat in the matrix.
#[derive(Debug, Clone, Copy)]
pub struct RunOf<'a> {
    pub workload: &'a str,
    pub load: f64,
    pub run: usize,
    pub seed: u64,
    pub row: &'a str,
    /// The run's plan's parts, to name each sample's (a `mix`'s).
    pub parts: &'a [Part],
}

#[derive(Serialize)]
struct Line<'a> {
    workload: &'a str,
    load: f64,
    run: usize,
    seed: u64,
    row: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<String>,
    #[serde(flatten)]
    sample: &'a Sample,
}

impl Requests {
    /// Creates (truncates) `<dir>/requests.jsonl`.
    pub fn create(dir: &Path) -> Result<Self, Error> {
        let path = dir.join("requests.jsonl");
        let file = File::create(&path).map_err(|source| Error::Io {
            what: format!("creating {}", path.display()),
            source,
        })?;
        Ok(Self {
            path,
            out: BufWriter::new(file),
        })
    }

    /// Appends one run's samples, in the order they were sent.
    pub fn write(&mut self, at: RunOf<'_>, samples: &[Sample]) -> Result<(), Error> {
        let mut order: Vec<&Sample> = samples.iter().collect();
        order.sort_by(|a, b| a.start.total_cmp(&b.start));
        for sample in order {
            let line = Line {
                workload: at.workload,
                load: at.load,
                run: at.run,
                seed: at.seed,
                row: at.row,
                part: sample
                    .session
                    .and_then(|u| Part::of_user(at.parts, u))
                    .map(|w| w.to_string()),
                sample,
            };
            serde_json::to_writer(&mut self.out, &line)
                .map_err(|e| Error::Setup(format!("{}: {e}", self.path.display())))?;
            self.out
                .write_all(b"\n")
                .map_err(|source| self.io(source))?;
        }
        self.out.flush().map_err(|source| self.io(source))
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            what: format!("writing {}", self.path.display()),
            source,
        }
    }
}
