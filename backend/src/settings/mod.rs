//! Every environment variable the backend reads, or computes for a library it loads, declared in
//! one table ([`VARIABLES`]): its name, what it does, its default and how its value is parsed.
//!
//! The rest of the backend reads the environment only through these descriptors
//! ([`Variable::var`], [`Variable::var_os`], [`Variable::value`]); the `*_ENV` constants other
//! crates use (`burn_trainium::DEVICE_ENV`, ...) are the descriptors' names. The variables marked
//! [`Variable::user_facing`] are exactly those of the README's table (a unit test checks both
//! ways).

mod table;

use std::env::VarError;
use std::ffi::OsString;

pub use table::*;

/// Who acts on a variable's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The backend reads it and acts on it.
    Backend,
    /// A library the backend loads reads it (named here); the backend reads it at most to check
    /// it, log it or key its caches on it.
    Library(&'static str),
}

/// One environment variable: the descriptor of a row of [`VARIABLES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// What it does, in a sentence.
    pub meaning: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
    /// The values it takes and how they are parsed: blank values, bad values.
    pub parser: &'static str,
    /// Who acts on its value.
    pub reader: Reader,
    /// Whether the backend computes its value for the library that reads it (for each process of
    /// a job: [`crate::neuron::process_environment`]), which `hlat` sets unless it is set.
    pub set_by_backend: bool,
    /// Whether a user sets it to choose or tune the backend: listed in the README's table.
    pub user_facing: bool,
}

impl Variable {
    /// The value, as [`std::env::var`] returns it.
    pub fn var(&self) -> Result<String, VarError> {
        std::env::var(self.name)
    }

    /// The value, as [`std::env::var_os`] returns it.
    pub fn var_os(&self) -> Option<OsString> {
        std::env::var_os(self.name)
    }

    /// The value when it is set and valid UTF-8.
    pub fn value(&self) -> Option<String> {
        self.var().ok()
    }
}

/// The variable of [`VARIABLES`] named `name`.
pub fn named(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|variable| variable.name == name)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    /// The README this crate's variables are documented in.
    const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));

    /// The variable names of the README's table of environment variables: the backquoted
    /// upper-case words with an underscore (before any `=`) of the rows of the table whose header
    /// is `| variable | meaning |`.
    fn readme_variables() -> BTreeSet<&'static str> {
        let mut lines = README
            .lines()
            .skip_while(|line| !line.starts_with("| variable | meaning |"));
        assert!(lines.next().is_some(), "the README has no variables table");
        lines
            .skip(1)
            .take_while(|line| line.starts_with('|'))
            .flat_map(|row| row.split('`').skip(1).step_by(2))
            // `RUST_LOG=debug` names `RUST_LOG`.
            .map(|word| word.split('=').next().unwrap_or(word))
            .filter(|word| {
                word.contains('_')
                    && word
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
            .collect()
    }

    #[test]
    fn the_readme_table_lists_exactly_the_user_facing_variables() {
        let listed = readme_variables();
        let user_facing: BTreeSet<&str> = VARIABLES
            .iter()
            .filter(|variable| variable.user_facing)
            .map(|variable| variable.name)
            .collect();
        let missing: Vec<_> = user_facing.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "user-facing variables missing from the README's table: {missing:?}"
        );
        let unknown: Vec<_> = listed
            .iter()
            .filter(|name| named(name).is_none_or(|variable| !variable.user_facing))
            .collect();
        assert!(
            unknown.is_empty(),
            "the README's table names variables the settings do not know as user-facing: \
             {unknown:?}"
        );
    }

    #[test]
    fn every_variable_is_declared_once_and_described() {
        let names: BTreeSet<&str> = VARIABLES.iter().map(|variable| variable.name).collect();
        assert_eq!(names.len(), VARIABLES.len(), "a variable is declared twice");
        for variable in VARIABLES {
            assert!(
                !variable.meaning.is_empty()
                    && !variable.default.is_empty()
                    && !variable.parser.is_empty(),
                "{} lacks a meaning, default or parser",
                variable.name
            );
        }
    }

    #[test]
    fn numeric_defaults_match_the_code() {
        let default = |variable: &Variable| variable.default.replace(',', "");
        assert_eq!(
            default(&SEGMENT_CAP),
            crate::DEFAULT_SEGMENT_CAP.to_string()
        );
        assert_eq!(
            default(&PJRT_CPU_DEVICES),
            crate::DEFAULT_CPU_DEVICES.to_string()
        );
        assert_eq!(
            default(&XLA_CACHE_MAX_BYTES),
            format!("{} (4 GiB)", crate::xla_cache::DEFAULT_MAX_BYTES)
        );
        assert_eq!(
            default(&JOIN_TIMEOUT),
            crate::distributed::DEFAULT_JOIN_TIMEOUT
                .as_secs()
                .to_string()
        );
        assert_eq!(
            default(&EXCHANGE_TIMEOUT),
            crate::distributed::DEFAULT_EXCHANGE_TIMEOUT
                .as_secs()
                .to_string()
        );
    }

    /// Every `.rs` file under `folder`.
    fn sources(folder: &Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, files);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }

    #[test]
    fn the_backend_reads_the_environment_only_through_the_settings() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let own = root.join("settings");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let reads = ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("];
        let offenders: Vec<String> = files
            .iter()
            .filter(|path| !path.starts_with(&own))
            .filter(|path| {
                let text = std::fs::read_to_string(path).unwrap();
                reads.iter().any(|read| text.contains(read))
            })
            .map(|path| path.display().to_string())
            .collect();
        assert!(
            offenders.is_empty(),
            "read the environment through crate::settings instead: {offenders:?}"
        );
    }
}
