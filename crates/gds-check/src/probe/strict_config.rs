//! The private cufile.json a strict run uses.

use crate::parse::strip_json_comments;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Private cufile.json for strict mode: the operator's config with compat mode off and the log
/// redirected, so the probe neither falls back silently nor writes into the volume.
pub(super) fn write_strict_config(src: &Path, work: &Path) -> Result<PathBuf, String> {
    let mut v: Value = std::fs::read_to_string(src)
        .ok()
        .and_then(|t| strip_json_comments(&t).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(Default::default()));
    let obj = |v: &mut Value, k: &str| -> Option<()> {
        let m = v.as_object_mut()?;
        let e = m
            .entry(k)
            .or_insert_with(|| Value::Object(Default::default()));
        if !e.is_object() {
            *e = Value::Object(Default::default());
        }
        Some(())
    };
    obj(&mut v, "properties");
    obj(&mut v, "logging");
    v["properties"]["allow_compat_mode"] = Value::Bool(false);
    v["logging"]["dir"] = Value::String(work.to_string_lossy().into_owned());
    let dst = work.join("cufile.json");
    std::fs::write(&dst, serde_json::to_vec_pretty(&v).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", dst.display()))?;
    Ok(dst)
}
