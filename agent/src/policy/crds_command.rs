//! `warmpath crds`: prints or writes the CRDs ([`super::crds`]) and rewrites docs/policy.md's
//! field tables ([`super::schema_docs`]).

use std::path::PathBuf;

/// Options of `warmpath crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory (created if missing) instead of printing
    /// both to stdout: `--out charts/warmpath/crds`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also rewrite the field tables between the `<!-- fields:begin -->` and
    /// `<!-- fields:end -->` markers of this Markdown file (docs/policy.md).
    #[arg(long, value_name = "FILE")]
    pub docs: Option<PathBuf>,
}

/// Why `warmpath crds` failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0}: no `<!-- fields:begin -->` line followed by a `<!-- fields:end -->` line to put the field tables between"
    )]
    NoMarkers(PathBuf),
}

/// Runs `warmpath crds`: the YAML on stdout, or the files under `--out` (their paths
/// printed one a line); `--docs` rewrites the field tables of a Markdown file.
pub fn run(args: &CrdsArgs) -> Result<(), Error> {
    let io = |path: &std::path::Path, what| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, what, source }
    };
    if let Some(doc) = &args.docs {
        let text = std::fs::read_to_string(doc).map_err(io(doc, "read"))?;
        let tables = super::schema_docs::field_tables();
        let new = super::schema_docs::splice(&text, &tables)
            .ok_or_else(|| Error::NoMarkers(doc.clone()))?;
        std::fs::write(doc, new).map_err(io(doc, "write"))?;
        println!("{}", doc.display());
    }
    match &args.out {
        None if args.docs.is_none() => print!("{}", super::crds::crds_yaml()),
        None => {}
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(io(dir, "create"))?;
            for f in super::crds::crd_files() {
                let path = dir.join(&f.file_name);
                std::fs::write(&path, &f.yaml).map_err(io(&path, "write"))?;
                println!("{}", path.display());
            }
        }
    }
    Ok(())
}
