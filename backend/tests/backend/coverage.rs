//! The coverage table of the lowering (`docs/xla-coverage.md`) lists every operation kind of
//! `burn-ir` 0.22.1 and is up to date. Regenerate it with `UPDATE_XLA_COVERAGE=1 cargo test -p
//! burn-trainium --test backend coverage`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use burn_trainium::lower::{COVERAGE, coverage_markdown};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/xla-coverage.md");

/// The enums of `burn-ir` whose variants are operation kinds.
const ENUMS: [&str; 9] = [
    "OperationIr",
    "ActivationOperationIr",
    "DistributedOperationIr",
    "BaseOperationIr",
    "NumericOperationIr",
    "FloatOperationIr",
    "IntOperationIr",
    "BoolOperationIr",
    "ModuleOperationIr",
];

/// `OperationIr` variants that only group the enums above (or need a feature this crate leaves off).
const GROUPS: [&str; 11] = [
    "BaseFloat",
    "BaseInt",
    "BaseBool",
    "NumericFloat",
    "NumericInt",
    "Bool",
    "Int",
    "Float",
    "Module",
    "Distributed",
    "Activation",
];

/// The source of `burn-ir` 0.22.1's operations, from cargo's registry.
fn burn_ir_operations() -> String {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    let registry = cargo_home.join("registry/src");
    let source = std::fs::read_dir(&registry)
        .unwrap_or_else(|error| {
            panic!(
                "cannot read cargo's registry {}: {error}",
                registry.display()
            )
        })
        .filter_map(Result::ok)
        .map(|index| index.path().join("burn-ir-0.22.1/src/operation.rs"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "burn-ir 0.22.1 is not unpacked under {}",
                registry.display()
            )
        });
    std::fs::read_to_string(source).unwrap()
}

/// `Enum::Variant` for every variant of the operation enums.
fn variants(source: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for name in ENUMS {
        let start = source
            .find(&format!("pub enum {name} {{"))
            .unwrap_or_else(|| panic!("burn-ir has no enum {name}"));
        let body = &source[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
        for line in body.lines().map(str::trim) {
            if line.starts_with("//") || line.starts_with("#[") {
                continue;
            }
            let variant: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if variant.starts_with(|c: char| c.is_ascii_uppercase())
                && !(name == "OperationIr" && GROUPS.contains(&variant.as_str()))
            {
                names.insert(format!("{name}::{variant}"));
            }
        }
    }
    names
}

#[test]
fn the_table_lists_every_operation_of_burn_ir() {
    let expected = variants(&burn_ir_operations());
    let listed: BTreeSet<String> = COVERAGE.iter().map(|(name, _)| name.to_string()).collect();
    assert_eq!(
        listed.len(),
        COVERAGE.len(),
        "the table lists an operation twice"
    );
    let missing: Vec<_> = expected.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&expected).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "missing from the table: {missing:?}; not in burn-ir: {unknown:?}"
    );
}

#[test]
fn the_coverage_document_is_up_to_date() {
    let generated = coverage_markdown();
    if std::env::var_os("UPDATE_XLA_COVERAGE").is_some() {
        std::fs::create_dir_all(PathBuf::from(DOC).parent().unwrap()).unwrap();
        std::fs::write(DOC, &generated).unwrap();
    }
    let written = std::fs::read_to_string(DOC).unwrap_or_default();
    assert!(
        written == generated,
        "{DOC} is stale: run `UPDATE_XLA_COVERAGE=1 cargo test -p burn-trainium --test backend coverage`"
    );
}
