//! Lifts the Rust examples of the README, `docs/` and the libraries' doc comments into the test
//! that compiles them (`tests/doc_examples.rs`). A crate of its own, so that editing the docs
//! rebuilds only it.

use std::fmt::Write as _;
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=fence.rs");
    doc_examples()
}

/// Writes `doc_examples.rs` into `OUT_DIR`: for each Markdown file of the README and `docs/`
/// with ```` ```rust ```` blocks, one async function whose body is those blocks in order (a
/// later block may use what an earlier one made, as the prose reads them), and `EXAMPLES`, the
/// files lifted. `tests/doc_examples.rs` includes it, so an example that no longer compiles
/// fails the test build: nextest runs no doctests, and Markdown has none.
fn doc_examples() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(&std::env::var("CARGO_MANIFEST_DIR")?)
        .parent()
        .ok_or("the doc-examples crate has no parent directory")?
        .to_path_buf();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    println!("cargo:rerun-if-changed={}", root.join("docs").display());
    let mut out = String::new();
    let mut lifted = Vec::new();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let blocks = rust_blocks(&text);
        if blocks.is_empty() {
            continue;
        }
        let name = file.strip_prefix(&root)?.display().to_string();
        let function: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        writeln!(out, "/// The examples of `{name}`.")?;
        writeln!(
            out,
            "pub async fn {}() -> Result<(), Box<dyn std::error::Error>> {{",
            function.to_lowercase()
        )?;
        for (number, block) in blocks.iter().enumerate() {
            // A compile error points here: name the example it comes from.
            writeln!(out, "    // {name}, example {}", number + 1)?;
            out.push_str(block);
        }
        out.push_str("    #[allow(unreachable_code)]\n    Ok(())\n}\n\n");
        lifted.push(name);
    }
    writeln!(out, "/// The files whose examples are lifted above.")?;
    writeln!(out, "pub const EXAMPLES: &[&str] = &{lifted:?};")?;
    let mut sources = Vec::new();
    for dir in LIBRARY_SOURCES {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        rust_files(&dir, &mut sources)?;
    }
    sources.sort();
    let mut lifted = Vec::new();
    for file in &sources {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let name = file.strip_prefix(&root)?.display().to_string();
        let function: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        for (number, block) in doc_comment_blocks(&text).iter().enumerate() {
            // Each doc example stands alone, as rustdoc compiles it.
            writeln!(
                out,
                "/// Example {} of `{name}`'s doc comments.",
                number + 1
            )?;
            writeln!(
                out,
                "pub async fn {}_{}() -> Result<(), Box<dyn std::error::Error>> {{",
                function.to_lowercase(),
                number + 1
            )?;
            out.push_str(block);
            out.push_str("    #[allow(unreachable_code)]\n    Ok(())\n}\n\n");
            lifted.push(name.clone());
        }
    }
    lifted.dedup();
    writeln!(
        out,
        "/// The library sources whose doc examples are lifted above."
    )?;
    writeln!(
        out,
        "pub const DOC_COMMENT_EXAMPLES: &[&str] = &{lifted:?};"
    )?;
    let path = Path::new(&std::env::var("OUT_DIR")?).join("doc_examples.rs");
    std::fs::write(path, out)?;
    Ok(())
}

/// The bodies of the ```` ```rust ```` blocks of a Markdown text.
fn rust_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if is_rust_fence(line) => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// The Rust files under `dir`, recursively.
fn rust_files(
    dir: &Path,
    files: &mut Vec<std::path::PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    for entry in
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?
    {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, files)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

include!("fence.rs");
