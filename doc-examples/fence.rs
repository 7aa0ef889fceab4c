/// Whether `line` opens a Rust example: ```` ```rust ````, also with attributes (```` ```rust,no_run
/// ````); not one marked `ignore` (a fragment on purpose). One rule for the build script that lifts
/// the examples and for the test that checks every file with one was lifted.
fn is_rust_fence(line: &str) -> bool {
    let Some(info) = line.trim_start().strip_prefix("```") else {
        return false;
    };
    let mut words = info.split([',', ' ']).filter(|word| !word.is_empty());
    words.next() == Some("rust") && !words.any(|word| word == "ignore")
}

/// The libraries' source directories whose doc comments' examples are compiled (nextest runs no
/// doctests).
const LIBRARY_SOURCES: &[&str] = &["rpc/src", "statemachine/src"];

/// The text of a doc comment line (`///` or `//!`, one space after it dropped), or `None` (also
/// for `////...`, a plain comment).
fn doc_line(line: &str) -> Option<&str> {
    let line = line.trim_start();
    let doc = match line.strip_prefix("///") {
        Some(rest) if rest.starts_with('/') => return None,
        Some(rest) => rest,
        None => line.strip_prefix("//!")?,
    };
    Some(doc.strip_prefix(' ').unwrap_or(doc))
}

/// Whether a doc comment line opens a Rust example as rustdoc reads it: a bare ```` ``` ```` is
/// Rust too; `ignore`, `compile_fail` and other languages are not compiled.
fn is_doc_rust_fence(doc: &str) -> bool {
    let Some(info) = doc.trim_start().strip_prefix("```") else {
        return false;
    };
    let mut words = info.split([',', ' ']).filter(|word| !word.is_empty()).peekable();
    let language_ok = match words.peek() {
        None => true,
        Some(&"rust") => true,
        Some(word) => matches!(*word, "no_run" | "should_panic" | "edition2021" | "edition2024"),
    };
    language_ok && !words.any(|word| matches!(word, "ignore" | "compile_fail" | "text"))
}

/// The bodies of the Rust examples in a source's doc comments, hidden lines (`# ...`) shown.
fn doc_comment_blocks(text: &str) -> Vec<String> {
    /// Where the scan is: outside a fenced block, in a Rust one, or in one of another language.
    enum In {
        Prose,
        Rust(String),
        Other,
    }
    let mut blocks = Vec::new();
    let mut at = In::Prose;
    for line in text.lines() {
        let Some(doc) = doc_line(line) else {
            at = In::Prose;
            continue;
        };
        let fence = doc.trim_start().starts_with("```");
        at = match at {
            In::Prose if fence && is_doc_rust_fence(doc) => In::Rust(String::new()),
            In::Prose if fence => In::Other,
            In::Rust(block) if fence => {
                blocks.push(block);
                In::Prose
            }
            In::Other if fence => In::Prose,
            In::Rust(mut block) => {
                let shown = match doc.trim_start() {
                    "#" => "",
                    hidden if hidden.starts_with("# ") => &hidden[2..],
                    _ => doc,
                };
                block.push_str(shown);
                block.push('\n');
                In::Rust(block)
            }
            other => other,
        };
    }
    blocks
}
