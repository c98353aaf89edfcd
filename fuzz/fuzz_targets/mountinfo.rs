//! `/proc/self/mountinfo`, which every idempotency decision is taken from.
#![no_main]

use gds_csi::os::mount;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = mount::parse_table(data) {
        for m in &table {
            let top = mount::at(&table, &m.mount_point)
                .expect("an entry is found at its own mount point");
            assert_eq!(top.mount_point, m.mount_point);
            let _ = (
                m.read_only(),
                m.fs_read_only(),
                m.is_device(m.major, m.minor),
            );
        }
    }
});
