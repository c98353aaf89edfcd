//! The cufile.json each resource hands its containers: the node's own file with compat mode
//! set as the resource's GDS policy implies. Parsed with gds-check's reader (comments and
//! trailing commas allowed), so the gate, `doctor` and the workloads read the same file alike.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::Resource;

/// The cufile.json for `resource`, from the node's file (`None`: the node has none, and
/// libcufile's defaults apply to every other key). `gds` (gdsPolicy `required`) turns
/// compat mode off, `force_compat_mode` included, so a read that cannot take the GDS
/// path fails instead of silently going through POSIX; `gds-compat` (`preferred`) allows
/// it. Every other key is the operator's.
pub fn derive(node: Option<&str>, resource: Resource) -> Result<String, String> {
    let mut root = match node {
        None => Value::Object(Map::new()),
        Some(text) => {
            gds_check::parse::parse_cufile_json(text)
                .map_err(|e| e.to_string())?
                .raw
        }
    };
    let properties = root
        .as_object_mut()
        .ok_or("top level is not an object")?
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    let properties = properties
        .as_object_mut()
        .ok_or("properties: expected an object")?;
    properties.insert(
        "allow_compat_mode".into(),
        Value::Bool(resource.compat_allowed()),
    );
    if !resource.compat_allowed() && properties.contains_key("force_compat_mode") {
        properties.insert("force_compat_mode".into(), Value::Bool(false));
    }
    let mut text = serde_json::to_string_pretty(&root).map_err(|e| e.to_string())?;
    text.push('\n');
    Ok(text)
}

/// Writes `resource`'s file into `dir` from the node's cufile.json at `node_json`, replacing
/// it (atomically) only when its content changed; the path written. A container holds the
/// file it started with: a rename leaves its bind mount on the old inode.
pub fn write(dir: &Path, node_json: &Path, resource: Resource) -> Result<PathBuf, String> {
    let node = match std::fs::read_to_string(node_json) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("reading {}: {e}", node_json.display())),
    };
    let text = derive(node.as_deref(), resource)
        .map_err(|e| format!("the node's cufile.json {}: {e}", node_json.display()))?;
    let path = dir.join(resource.cufile_file_name());
    if std::fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    crate::runtime::state_dir::write_atomic(&path, text.as_bytes())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node file as NVIDIA ships it: comments, a trailing comma, compat allowed.
    const NODE: &str = r#"{
    // logging
    "logging": { "dir": "/var/log/gds", "level": "ERROR" },
    "properties": {
        "max_direct_io_size_kb": 16384,
        /* allow compat mode, this will enable use of cuFile posix read/writes */
        "allow_compat_mode": true,
        "rdma_dev_addr_list": [ "172.172.1.240" ],
    },
    "fs": { "generic": { "posix_unaligned_writes": false } }
}"#;

    fn parsed(text: &str) -> gds_check::parse::CufileConfig {
        gds_check::parse::parse_cufile_json(text).unwrap()
    }

    #[test]
    fn required_turns_compat_off_and_keeps_every_other_key() {
        let out = derive(Some(NODE), Resource::Gds).unwrap();
        let c = parsed(&out);
        assert_eq!(c.allow_compat_mode, Some(false));
        assert!(!c.compat_allowed());
        assert_eq!(c.max_direct_io_size_kb, Some(16384));
        assert_eq!(c.rdma_dev_addr_list, ["172.172.1.240"]);
        assert_eq!(c.logging_dir.as_deref(), Some("/var/log/gds"));
        assert_eq!(c.posix_unaligned_writes, Some(false));
        // Plain JSON: any reader takes it, not only one that strips comments.
        serde_json::from_str::<Value>(&out).unwrap();
    }

    #[test]
    fn compat_allows_it_whatever_the_node_says() {
        let strict = NODE.replace(
            r#""allow_compat_mode": true"#,
            r#""allow_compat_mode": false"#,
        );
        let c = parsed(&derive(Some(&strict), Resource::GdsCompat).unwrap());
        assert_eq!(c.allow_compat_mode, Some(true));
        assert_eq!(c.max_direct_io_size_kb, Some(16384));
    }

    /// force_compat_mode would send every read through POSIX: `required` never keeps it,
    /// `preferred` keeps what the operator chose.
    #[test]
    fn forced_compat_is_undone_only_for_required() {
        let forced = NODE.replace(
            r#""max_direct_io_size_kb": 16384,"#,
            r#""max_direct_io_size_kb": 16384, "force_compat_mode": true,"#,
        );
        let required = parsed(&derive(Some(&forced), Resource::Gds).unwrap());
        assert_eq!(required.force_compat_mode, Some(false));
        assert!(!required.compat_allowed());
        let preferred = parsed(&derive(Some(&forced), Resource::GdsCompat).unwrap());
        assert_eq!(preferred.force_compat_mode, Some(true));
        // Not added where the node did not set it.
        assert_eq!(
            parsed(&derive(Some(NODE), Resource::Gds).unwrap()).force_compat_mode,
            None
        );
    }

    #[test]
    fn no_node_file_gives_the_policy_alone() {
        for (resource, allowed) in [(Resource::Gds, false), (Resource::GdsCompat, true)] {
            let v: Value = serde_json::from_str(&derive(None, resource).unwrap()).unwrap();
            assert_eq!(
                v,
                serde_json::json!({"properties": {"allow_compat_mode": allowed}})
            );
        }
    }

    #[test]
    fn a_file_libcufile_cannot_read_is_refused_by_name() {
        for (bad, says) in [
            ("{ \"properties\": ", "invalid JSON: EOF"),
            ("[1]", "top level is not an object"),
            ("{\"properties\": []}", "properties: expected an object"),
            (
                "{\"properties\": {\"allow_compat_mode\": \"yes\"}}",
                "properties.allow_compat_mode: expected true or false",
            ),
        ] {
            let e = derive(Some(bad), Resource::Gds).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn write_replaces_the_file_only_when_it_changes() {
        let t = tempfile::tempdir().unwrap();
        let node = t.path().join("cufile.json");
        let out = t.path().join("workload");
        std::fs::write(&node, NODE).unwrap();
        let path = write(&out, &node, Resource::Gds).unwrap();
        assert_eq!(path, out.join("cufile-gds.json"));
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let first = ino(&path);
        write(&out, &node, Resource::Gds).unwrap();
        assert_eq!(ino(&path), first, "unchanged content, same file");
        std::fs::write(&node, NODE.replace("16384", "8192")).unwrap();
        write(&out, &node, Resource::Gds).unwrap();
        assert_ne!(
            ino(&path),
            first,
            "a new file, so running containers keep theirs"
        );
        assert_eq!(
            parsed(&std::fs::read_to_string(&path).unwrap()).max_direct_io_size_kb,
            Some(8192)
        );
        std::fs::write(&node, "{ garbage").unwrap();
        let e = write(&out, &node, Resource::Gds).unwrap_err();
        assert!(e.contains(&node.display().to_string()), "{e}");
    }
}
