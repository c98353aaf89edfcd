//! The nvidia-fs procfs files (modules, version, stats) and the small host files the GDS
//! checks read (osrelease, the udev database, kallsyms, escaped mount paths).
#![no_main]

use gds_check::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(modules) = parse::parse_modules(&text) {
        for m in modules {
            assert!(!m.name.is_empty() && m.name.len() <= 64);
        }
    }
    if let Ok(v) = parse::parse_nvfs_version(&text) {
        assert!(!v.raw.is_empty());
    }
    let _ = parse::parse_stats(&text);
    let _ = parse::parse_kernel_version(&text);
    let _ = parse::parse_udev_db(&text);
    let _ = parse::unescape_mount_path(&text);
    let _ = parse::kallsyms_find(data, &["nvfs_get_ops", "nvme_setup_cmd"]);
});
