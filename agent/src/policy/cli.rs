//! `warmpath policy ...`: policy files checked without an agent, for CI pipelines.
//!
//! `warmpath policy validate FILE|DIR...` reads every file (a directory: each `*.yaml` and
//! `*.yml` directly inside it, by name), checks each resource and then all of them as one
//! set, and prints one line per problem:
//!
//! ```text
//! team-a.yaml: RoutePolicy ml/canary: spec.action.weights.inFlight: `-1`: weight ...
//! ```
//!
//! then a summary line (not with `--quiet`). Any problem makes the command fail (non-zero
//! exit status).

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
};

use super::{
    documents::{self, MAX_FILE_BYTES},
    resources::Resource,
    validate,
};

/// Most files one run reads (every resource is held for the set checks).
pub const MAX_FILES: usize = 10_000;

/// `warmpath policy` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Check RoutePolicy and Tenant files: every error with its field path, value and
    /// reason; exit status non-zero on any.
    Validate(ValidateArgs),
    /// Print a version-1 configuration file's pools and tenants as RoutePolicy and Tenant
    /// resources (docs/policy.md, "Conversion from the v1 config file").
    Convert(super::convert::ConvertArgs),
}

/// `warmpath policy validate`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Files, or directories (every *.yaml and *.yml directly inside, by name).
    #[arg(required = true, value_name = "FILE")]
    pub paths: Vec<PathBuf>,
    /// Print only the errors (no summary line).
    #[arg(long)]
    pub quiet: bool,
}

/// Why a `warmpath policy` command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{errors} error(s) in the policy files (each printed above)")]
    Invalid { errors: usize, files: usize },
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
    #[error(transparent)]
    Convert(#[from] super::convert::Error),
}

/// Runs a `warmpath policy` command, writing its report to stdout.
pub fn run(cmd: &PolicyCommand) -> Result<(), Error> {
    match cmd {
        PolicyCommand::Validate(args) => validate_files(args, &mut std::io::stdout().lock()),
        PolicyCommand::Convert(args) => {
            Ok(super::convert::run(args, &mut std::io::stdout().lock())?)
        }
    }
}

/// What was read: resources with the file each came from.
#[derive(Debug, Default)]
struct Loaded {
    files: Vec<String>,
    resources: Vec<Resource>,
    /// Index into `files` of each resource.
    file_of: Vec<usize>,
}

/// `warmpath policy validate`: writes one line per error (and a summary unless quiet) to
/// `out`; fails with [`Error::Invalid`] when there is any error.
pub fn validate_files(args: &ValidateArgs, out: &mut dyn Write) -> Result<(), Error> {
    let mut errors = 0;
    let mut read = Loaded::default();
    let files = match expand(&args.paths) {
        Ok(files) => files,
        Err(lines) => {
            for line in &lines {
                writeln!(out, "{line}")?;
            }
            return Err(Error::Invalid {
                errors: lines.len(),
                files: 0,
            });
        }
    };
    for path in &files {
        let file = path.display().to_string();
        let text = match read_bounded(path) {
            Ok(text) => text,
            Err(why) => {
                writeln!(out, "{file}: {why}")?;
                errors += 1;
                read.files.push(file);
                continue;
            }
        };
        match documents::parse(&file, &text) {
            Ok(resources) => {
                let index = read.files.len();
                for r in resources {
                    for e in validate::validate(&r) {
                        writeln!(out, "{file}: {} {}: {e}", r.kind(), r.key())?;
                        errors += 1;
                    }
                    read.resources.push(r);
                    read.file_of.push(index);
                }
            }
            Err(e) => {
                writeln!(out, "{e}")?;
                errors += 1;
            }
        }
        read.files.push(file);
    }
    for (i, e) in validate::validate_set_indexed(&read.resources) {
        let r = &read.resources[i];
        let file = &read.files[read.file_of[i]];
        writeln!(out, "{file}: {} {}: {e}", r.kind(), r.key())?;
        errors += 1;
    }
    if !args.quiet {
        let policies = read
            .resources
            .iter()
            .filter(|r| matches!(r, Resource::RoutePolicy(_)))
            .count();
        let tenants = read.resources.len() - policies;
        let verdict = if errors == 0 {
            "valid".to_string()
        } else {
            format!("{errors} error(s)")
        };
        writeln!(
            out,
            "{} file(s), {policies} RoutePolicy, {tenants} Tenant: {verdict}",
            read.files.len()
        )?;
    }
    if errors > 0 {
        return Err(Error::Invalid {
            errors,
            files: read.files.len(),
        });
    }
    Ok(())
}

/// The files to read, in the order given, directories expanded; or one line per path that
/// cannot be read as either.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<String>> {
    let mut files = Vec::new();
    let mut bad = Vec::new();
    for p in paths {
        if p.is_dir() {
            match yaml_files(p) {
                Ok(mut inside) => files.append(&mut inside),
                Err(e) => bad.push(format!("{}: cannot list the directory: {e}", p.display())),
            }
        } else if p.exists() {
            files.push(p.clone());
        } else {
            bad.push(format!("{}: no such file or directory", p.display()));
        }
    }
    if files.len() > MAX_FILES {
        bad.push(format!(
            "{} files: at most {MAX_FILES} are read in one run",
            files.len()
        ));
    }
    if bad.is_empty() { Ok(files) } else { Err(bad) }
}

/// `*.yaml` and `*.yml` files directly in `dir`, by name.
fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let yaml = path.extension().is_some_and(|x| x == "yaml" || x == "yml");
        if yaml && path.is_file() {
            out.push(path);
            if out.len() > MAX_FILES {
                break;
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The file's text, refused past the policy-file size limit without reading all of it.
fn read_bounded(path: &Path) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!(
            "larger than the {MAX_FILE_BYTES}-byte limit for a policy file"
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("warmpath-policy-cli-{}-{name}", std::process::id()));
            // A leftover of an earlier run with this process id.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write temp file");
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run_on(paths: Vec<PathBuf>, quiet: bool) -> (Result<(), Error>, String) {
        let mut out = Vec::new();
        let r = validate_files(&ValidateArgs { paths, quiet }, &mut out);
        (r, String::from_utf8(out).expect("report is UTF-8"))
    }

    const VALID: &str = "
apiVersion: warmpath.dev/v1alpha1
kind: RoutePolicy
metadata: {name: canary, namespace: ml}
spec:
  targetRef: {pool: {name: chat}}
  action: {preset: least-loaded}
---
apiVersion: warmpath.dev/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  identity: {cidrs: [10.0.0.0/8]}
";

    #[test]
    fn a_valid_file_passes_with_a_summary() {
        let dir = TempDir::new("valid");
        let f = dir.write("ok.yaml", VALID);
        let (r, out) = run_on(vec![f], false);
        assert!(r.is_ok(), "{r:?}: {out}");
        assert_eq!(out, "1 file(s), 1 RoutePolicy, 1 Tenant: valid\n");
        let (r, out) = run_on(vec![dir.0.clone()], true);
        assert!(r.is_ok());
        assert_eq!(out, "", "--quiet prints only errors");
    }

    #[test]
    fn every_error_is_reported_with_its_file_object_and_path() {
        let dir = TempDir::new("three");
        let bad = VALID
            .replace(
                "preset: least-loaded",
                "weights: {inFlight: -1}, retries: 17",
            )
            .replace("10.0.0.0/8", "10.0.0.0/99");
        let f = dir.write("bad.yaml", &bad);
        let (r, out) = run_on(vec![f.clone()], false);
        let file = f.display();
        assert_eq!(
            out,
            format!(
                "{file}: RoutePolicy ml/canary: spec.action.weights.inFlight: `-1`: weight inFlight=-1: must be a finite number >= 0\n\
                 {file}: RoutePolicy ml/canary: spec.action.retries: `17`: must be 0 to 16\n\
                 {file}: Tenant team-a: spec.identity.cidrs[0]: `10.0.0.0/99`: expected a CIDR such as 10.0.0.0/8, or an address\n\
                 1 file(s), 1 RoutePolicy, 1 Tenant: 3 error(s)\n"
            )
        );
        assert!(
            matches!(
                r,
                Err(Error::Invalid {
                    errors: 3,
                    files: 1
                })
            ),
            "{r:?}"
        );
    }

    #[test]
    fn directories_are_read_by_name_and_checked_as_one_set() {
        let dir = TempDir::new("dir");
        dir.write("b.yml", VALID);
        // The same objects again in a later file: both rejected there, not in b.yml.
        let second = dir.write("c.yaml", VALID);
        dir.write("a.txt", "not: [policy");
        let unparsable = dir.write("a.yaml", "apiVersion: warmpath.dev/v1alpha1\nkind: Pod\n");
        let (r, out) = run_on(vec![dir.0.clone()], false);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(
            lines[0],
            format!(
                "{}: document 1 (Pod ?): kind: `Pod`: expected RoutePolicy or Tenant",
                unparsable.display()
            )
        );
        assert!(
            lines[1].starts_with(&format!(
                "{}: RoutePolicy ml/canary: metadata.name: `canary`: RoutePolicy ml/canary is given twice",
                second.display()
            )),
            "{out}"
        );
        assert!(
            lines[2].starts_with(&format!(
                "{}: Tenant team-a: metadata.name: `team-a`: Tenant team-a is given twice",
                second.display()
            )),
            "{out}"
        );
        assert_eq!(lines[3], "3 file(s), 2 RoutePolicy, 2 Tenant: 3 error(s)");
        assert!(matches!(
            r,
            Err(Error::Invalid {
                errors: 3,
                files: 3
            })
        ));
    }

    #[test]
    fn a_missing_path_is_an_error() {
        let dir = TempDir::new("missing");
        let gone = dir.0.join("nothing.yaml");
        let (r, out) = run_on(vec![gone.clone()], false);
        assert_eq!(
            out,
            format!("{}: no such file or directory\n", gone.display())
        );
        assert!(matches!(
            r,
            Err(Error::Invalid {
                errors: 1,
                files: 0
            })
        ));
    }

    #[test]
    fn the_examples_validate() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies");
        let (r, out) = run_on(vec![examples], false);
        assert!(r.is_ok(), "{out}");
        assert!(out.ends_with(": valid\n"), "{out}");
    }
}
