//! Stand-alone cuFile probe child, for tests and manual runs. The gds-csi binary exposes the
//! same entry point as its hidden `cufile-probe` subcommand.
fn main() {
    match gds_check::ProbeArgs::parse(std::env::args().skip(1)) {
        Ok(a) => std::process::exit(gds_check::probe_child_main(a)),
        Err(e) => {
            eprintln!("gds-probe: {e}");
            std::process::exit(2);
        }
    }
}
