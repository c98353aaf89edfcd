// Generates the gRPC services of the vendored specs: CSI (proto/csi.proto) and the kubelet's
// device plugin API (proto/deviceplugin.proto). protoc comes from the protoc-bin-vendored
// crate so a fresh machine builds without a system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    let include = protoc_bin_vendored::include_path()?;
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &[
                std::path::Path::new("proto/csi.proto"),
                std::path::Path::new("proto/deviceplugin.proto"),
            ],
            &[std::path::Path::new("proto"), include.as_path()],
        )?;
    Ok(())
}
