//! The fill pod's progress, read from the last lines of its log: `gds-csi populate`
//! prints one JSON line every few seconds and a last one saying how it ended
//! (src/volume/populate.rs in the driver, `Report`: the two sides of one format).

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Measuring, Copying, Done or Failed.
    pub phase: String,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    pub entries: u64,
    pub bytes_per_second: u64,
    pub message: String,
}

impl Report {
    /// The last report in `log`; lines that are not one (a crash's output) are skipped.
    pub fn last_in(log: &str) -> Option<Report> {
        log.lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Report>(l.trim()).ok())
    }

    /// Whole percent copied.
    pub fn percent(&self) -> u64 {
        (self.copied_bytes * 100)
            .checked_div(self.total_bytes)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_report_wins_and_other_lines_are_skipped() {
        let log = concat!(
            r#"{"phase":"Copying","copiedBytes":10,"totalBytes":40,"entries":3,"bytesPerSecond":5,"message":"m1"}"#,
            "\n",
            r#"{"phase":"Copying","copiedBytes":20,"totalBytes":40,"entries":3,"bytesPerSecond":5,"message":"m2"}"#,
            "\nthread 'main' panicked\n"
        );
        let r = Report::last_in(log).unwrap();
        assert_eq!(
            (r.copied_bytes, r.percent(), r.message.as_str()),
            (20, 50, "m2")
        );
        assert_eq!(Report::last_in("no report\n"), None);
    }
}
