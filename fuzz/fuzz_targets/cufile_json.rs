//! cufile.json: JSON with comments and trailing commas, written by operators.
#![no_main]

use gds_check::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(stripped) = parse::strip_json_comments(&text) {
        // Stripping keeps every newline, so JSON errors keep the operator's line numbers.
        assert_eq!(
            stripped.matches('\n').count(),
            text.matches('\n').count(),
            "line numbers moved"
        );
    }
    if let Ok(cfg) = parse::parse_cufile_json(&text) {
        let _ = (cfg.compat_allowed(), cfg.p2pdma_enabled());
    }
});
