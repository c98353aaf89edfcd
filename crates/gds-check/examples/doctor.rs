//! Node and volume checks against this host: `cargo run -p gds-check --example doctor -- nvme /mnt/vol`.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]
use gds_check::{node_checks, volume_checks, Backend, HostPaths, Report};

fn main() {
    let mut args = std::env::args().skip(1);
    let backend: Backend = args
        .next()
        .unwrap_or_else(|| "nvme".into())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let paths = HostPaths::default();
    let mut report = Report::new(node_checks(&paths, backend));
    for mp in args {
        report.extend(volume_checks(&paths, backend, mp.as_ref()));
    }
    print!("{}", report.to_text());
}
