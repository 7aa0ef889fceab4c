//! Generates the gRPC code with a vendored protoc, so a fresh machine needs nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto");
    // The descriptors also go into a file, for the gRPC reflection service nodes serve.
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("baton_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .compile_protos(&["proto/baton.proto"], &["proto"])?;
    Ok(())
}
