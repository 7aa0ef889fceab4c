//! The Rust examples of the README and `docs/`, compiled: `build.rs` lifts each Markdown file's
//! examples into a function here, so an example that no longer compiles (a renamed method, a
//! closure that must be `move`) fails this test's build. They are not run: they need a cluster,
//! and what they do is tested elsewhere.
#![allow(
    unused,
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::pedantic
)]

mod lifted {
    include!(concat!(env!("OUT_DIR"), "/doc_examples.rs"));
}

/// Every Markdown file with a Rust example is lifted (counted here again from the files), so a
/// change of directory or a failed read cannot leave examples silently unchecked.
#[test]
fn every_file_with_a_rust_example_is_compiled() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut with_examples = Vec::new();
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        files.push(entry.expect("a docs entry").path());
    }
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.lines().any(is_rust_fence) {
            let name = file.strip_prefix(root).expect("under the root");
            with_examples.push(name.display().to_string());
        }
    }
    with_examples.sort();
    let mut lifted: Vec<String> = lifted::EXAMPLES.iter().map(|s| s.to_string()).collect();
    lifted.sort();
    assert_eq!(lifted, with_examples);
    assert!(lifted.len() >= 8, "{lifted:?}");
    assert!(
        lifted.contains(&"docs/task-queue.md".to_string()),
        "{lifted:?}"
    );
}

/// Every library source with a Rust example in its doc comments is lifted too.
#[test]
fn every_library_doc_example_is_compiled() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut with_examples = Vec::new();
    let mut dirs: Vec<_> = LIBRARY_SOURCES.iter().map(|dir| root.join(dir)).collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a source entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if !doc_comment_blocks(&text).is_empty() {
                let name = path.strip_prefix(root).expect("under the root");
                with_examples.push(name.display().to_string());
            }
        }
    }
    with_examples.sort();
    let mut lifted: Vec<String> = lifted::DOC_COMMENT_EXAMPLES
        .iter()
        .map(|s| s.to_string())
        .collect();
    lifted.sort();
    assert_eq!(lifted, with_examples);
    assert!(
        lifted.contains(&"rpc/src/worker.rs".to_string()),
        "{lifted:?}"
    );
}

/// The doc-comment reading, on a made-up source: a bare fence and `rust,no_run` are Rust (hidden
/// `# ` lines shown), `text` and `ignore` are not, a `////` line is a plain comment, and a
/// block ends where the doc comment does.
#[test]
fn doc_comment_blocks_are_read_as_rustdoc_reads_them() {
    let source = [
        "//! ```",
        "//! # let hidden = 1;",
        "//! let shown = hidden;",
        "//! ```",
        "//! ```text",
        "//! not rust",
        "//! ```",
        "/// ```rust,no_run",
        "/// second();",
        "/// ```",
        "/// ```ignore",
        "/// ignored();",
        "/// ```",
        "//// ```",
        "//// plain();",
        "//// ```",
        "/// ```",
        "/// cut_short();",
        "fn item() {}",
    ]
    .join("\n");
    assert_eq!(
        doc_comment_blocks(&source),
        [
            "let hidden = 1;\nlet shown = hidden;\n".to_string(),
            "second();\n".to_string(),
        ]
    );
}

include!("../fence.rs");
