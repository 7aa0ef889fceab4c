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
