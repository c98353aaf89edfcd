//! The tests share one test double per driver port: a second double of the same trait
//! drifts from the first (a switch one has and the other lacks, behaviour that differs),
//! and the tests over them no longer agree on what the host does.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The trait an `impl ... for` line implements, by its last path segment:
/// `impl<T: Send> gds_csi::os::Host for X<T> {` -> `Host`.
fn implemented_trait(line: &str) -> Option<&str> {
    let mut rest = line.trim_start().strip_prefix("impl")?;
    if rest.starts_with('<') {
        let mut depth = 0;
        let end = rest.char_indices().find_map(|(i, c)| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        })?;
        rest = &rest[end + 1..];
    } else if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let (name, _) = rest.split_once(" for ")?;
    name.trim().rsplit("::").next()
}

#[test]
fn the_trait_parser_reads_plain_generic_and_qualified_impls() {
    assert_eq!(
        implemented_trait("impl Host for HostDouble {"),
        Some("Host")
    );
    assert_eq!(
        implemented_trait("impl<T: Send> gds_csi::os::Host for X<T> {"),
        Some("Host")
    );
    assert_eq!(implemented_trait("    impl Drop for Rig {"), Some("Drop"));
    assert_eq!(implemented_trait("impl HostDouble {"), None);
    assert_eq!(implemented_trait("implements Host for"), None);
}

#[test]
fn the_host_trait_has_one_test_double_in_tests_common() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut doubles = Vec::new();
    for file in rust_files(&tests) {
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if implemented_trait(line) == Some("Host") {
                let at = file.strip_prefix(&tests).unwrap().display();
                doubles.push(format!("tests/{at}:{}", n + 1));
            }
        }
    }
    assert_eq!(doubles.len(), 1, "Host doubles: {doubles:?}");
    assert!(
        doubles[0].starts_with("tests/common/host_double.rs:"),
        "{doubles:?}"
    );
}
