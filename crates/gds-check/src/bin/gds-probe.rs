//! Stand-alone cuFile probe child, for tests and manual runs. The gds-csi binary exposes the
//! same entry point as its hidden `cufile-probe` subcommand.
//!
//! `gds-probe --run [--timeout-s N] <probe args>` is the parent side instead, as the gate runs
//! it: the child(ren) under a deadline, then one JSON outcome (the strict run and, when that
//! finds no GDS path, the compat-allowed one).
fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--run") {
        args.remove(0);
        let mut timeout = 30;
        if args.first().map(String::as_str) == Some("--timeout-s") {
            timeout = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
            args.drain(..2.min(args.len()));
        }
        let a = gds_check::ProbeArgs::parse(args).unwrap_or_else(|e| {
            eprintln!("gds-probe: {e}");
            std::process::exit(2)
        });
        let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        let o = gds_check::run_probe(&exe, &[], &a, std::time::Duration::from_secs(timeout));
        println!("{}", serde_json::to_string_pretty(&o).unwrap_or_default());
        println!("summary: {}", o.summary());
        std::process::exit(i32::from(o.mode != gds_check::GdsMode::TrueGds));
    }
    match gds_check::ProbeArgs::parse(args) {
        Ok(a) => std::process::exit(gds_check::probe_child_main(a)),
        Err(e) => {
            eprintln!("gds-probe: {e}");
            std::process::exit(2);
        }
    }
}
