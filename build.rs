// Generates the CSI gRPC services from the vendored spec. protoc comes from the
// protoc-bin-vendored crate so a fresh machine builds without a system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    let include = protoc_bin_vendored::include_path()?;
    println!("cargo:rerun-if-changed=proto/csi.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &[std::path::Path::new("proto/csi.proto")],
            &[std::path::Path::new("proto"), include.as_path()],
        )?;
    Ok(())
}
