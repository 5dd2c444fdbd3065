//! SECURITY.md holds each claim by a named test: every test name it gives is a
//! test of this tree, so that a renamed or removed test cannot leave a claim
//! standing unchecked.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_test_security_md_names_is_a_test_of_this_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("SECURITY.md")).expect("SECURITY.md");
    // A test name: a backquoted snake_case phrase of five words or more (config
    // keys are shorter).
    let named: Vec<&str> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            w.split('_').count() >= 5
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .collect();
    assert!(named.len() >= 20, "SECURITY.md names its tests: {named:?}");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let text: String = files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    let missing: Vec<&&str> = named
        .iter()
        .filter(|n| !text.contains(&format!("fn {n}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "SECURITY.md names tests that are not here: {missing:?}"
    );
}
