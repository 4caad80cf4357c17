//! The repository stands alone: no tracked file refers to a path outside it.
//!
//! Every relative path written in a tracked text file (one that climbs with `..`) is resolved from the
//! file's folder and from its crate's folder (where `CARGO_MANIFEST_DIR` paths start). It must
//! name something inside the repository from one of them, or stay inside from both.
//!
//! And the map of the code, ARCHITECTURE.md, names only paths that exist.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The repository root (the workspace folder).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is inside the workspace")
        .to_path_buf()
}

/// The files git tracks, or every file outside `target/` and `.git/` when git cannot say.
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|output| output.status.success());
    if let Some(output) = listed {
        return output
            .stdout
            .split(|&byte| byte == 0)
            .filter(|name| !name.is_empty())
            .map(|name| root.join(String::from_utf8_lossy(name).as_ref()))
            .collect();
    }
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap_or_default();
            if path.is_dir() && name != "target" && name != ".git" {
                pending.push(path);
            } else if path.is_file() {
                files.push(path);
            }
        }
    }
    files
}

/// `base` joined with `relative`, `..` resolved lexically; `None` when it climbs above `root`.
fn resolve(root: &Path, base: &Path, relative: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component> = base.strip_prefix(root).ok()?.components().collect();
    for component in Path::new(relative).components() {
        match component {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(_) => parts.push(component),
            _ => {}
        }
    }
    Some(root.join(parts.iter().collect::<PathBuf>()))
}

/// The relative paths climbing with `..` in `text`.
fn climbing_paths(text: &str) -> Vec<String> {
    let climb = format!("{0}{0}/", '.');
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&climb) {
        let path: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "._-/".contains(*c))
            .collect();
        rest = &rest[start + path.len().max(1)..];
        // A path that goes on past `..` (a bare `..` climbs, but names nothing).
        let path = path.trim_end_matches(['.', '/']).to_string();
        if path.contains(|c: char| c.is_ascii_alphanumeric()) {
            found.push(path);
        }
    }
    found
}

/// The folder of the crate a file belongs to (the nearest folder above it with a Cargo.toml).
fn crate_folder(root: &Path, file: &Path) -> PathBuf {
    file.ancestors()
        .skip(1)
        .take_while(|folder| folder.starts_with(root))
        .find(|folder| folder.join("Cargo.toml").is_file())
        .unwrap_or(root)
        .to_path_buf()
}

#[test]
fn no_tracked_file_refers_to_a_path_outside_the_repository() {
    let root = root();
    let files = tracked_files(&root);
    assert!(files.len() > 50, "{} files found", files.len());
    let mut outside = Vec::new();
    for file in &files {
        // Large files are data (the tokenizer's vocabulary), not references.
        let is_data = std::fs::metadata(file).is_ok_and(|meta| meta.len() > 512 * 1024);
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text
        };
        if is_data {
            continue;
        }
        let bases = [
            file.parent().unwrap().to_path_buf(),
            crate_folder(&root, file),
        ];
        for path in climbing_paths(&text) {
            let resolved: Vec<Option<PathBuf>> = bases
                .iter()
                .map(|base| resolve(&root, base, &path))
                .collect();
            let names_something_inside = resolved.iter().flatten().any(|target| target.exists());
            let stays_inside = resolved.iter().all(Option::is_some);
            if !names_something_inside && !stays_inside {
                outside.push(format!(
                    "{}: `{path}`",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "paths outside the repository:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_check_finds_a_path_outside_and_accepts_one_inside() {
    let root = root();
    let climb = format!("{0}{0}/", '.');
    let text = format!("see {climb}{climb}sibling/fixtures and {climb}fixtures/README.md.");
    let paths = climbing_paths(&text);
    assert_eq!(
        paths,
        [
            format!("{climb}{climb}sibling/fixtures"),
            format!("{climb}fixtures/README.md")
        ]
    );
    let crate_folder = root.join("tests");
    assert_eq!(resolve(&root, &crate_folder, &paths[0]), None);
    assert!(resolve(&root, &crate_folder, &paths[1]).unwrap().exists());
}

/// The repository paths `text` names between backticks: those starting with a top folder of the
/// repository.
fn named_repository_paths(text: &str) -> Vec<String> {
    const TOP_FOLDERS: [&str; 10] = [
        "backend",
        "models",
        "trainer",
        "examples",
        "ffi",
        "tests",
        "test-support",
        "docs",
        "scripts",
        "fixtures",
    ];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| {
            TOP_FOLDERS.iter().any(|top| {
                quoted
                    .strip_prefix(top)
                    .is_some_and(|rest| rest.starts_with('/'))
            })
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_path_the_architecture_map_names_exists() {
    let root = root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let named = named_repository_paths(&map);
    assert!(
        named.len() > 40,
        "only {} paths found: {named:?}",
        named.len()
    );
    let missing: Vec<&String> = named
        .iter()
        .filter(|path| !root.join(path).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
    assert_eq!(
        named_repository_paths("`models/src/gone.rs` and `cargo test` and `docs/`"),
        ["models/src/gone.rs", "docs/"]
    );
}
