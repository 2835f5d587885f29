// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl cdi`: a Container Device Interface spec of the device nodes present, for container
//! runtimes (containerd, CRI-O, podman) and device plugins: one CDI device per node (`<N>` for
//! `/dev/neuron_udma<N>`) and `all`, each adding its character device node(s) to the container.
//! Kind `aws.amazon.com/neuron_udma`, so a container asks for
//! `aws.amazon.com/neuron_udma=0` or `aws.amazon.com/neuron_udma=all`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::nodes;

/// The CDI kind (vendor/class) of the spec.
pub const KIND: &str = "aws.amazon.com/neuron_udma";
/// The CDI specification version the spec follows: device names may start with a digit from
/// 0.5.0 on; no later field is used.
pub const CDI_VERSION: &str = "0.5.0";

#[derive(Args, Debug)]
pub struct CdiArgs {
    /// Write the spec to this file instead of stdout (runtimes read /etc/cdi/*.json and
    /// /var/run/cdi/*.json): written beside it and renamed into place.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The directory searched for neuron_udma* nodes (tests point it elsewhere).
    #[arg(long, hide = true, default_value = nodes::DEV_DIR)]
    pub dev_dir: PathBuf,
}

/// A CDI spec (the fields used here; CDI's schema/schema.json).
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: &'static str,
    pub kind: &'static str,
    pub devices: Vec<CdiDevice>,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    pub device_nodes: Vec<DeviceNode>,
}

/// A character device node: its path (the same in the container), numbers and access.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct DeviceNode {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub major: i64,
    pub minor: i64,
    pub permissions: &'static str,
}

/// The node `path`'s device numbers, if it is a character device.
fn char_node(path: &Path) -> Result<DeviceNode> {
    let md = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    if !md.file_type().is_char_device() {
        bail!("{} is not a character device", path.display());
    }
    let rdev = md.rdev();
    Ok(DeviceNode {
        path: path.display().to_string(),
        kind: "c",
        major: i64::from(libc::major(rdev)),
        minor: i64::from(libc::minor(rdev)),
        permissions: "rw",
    })
}

/// The spec of `nodes` (`(N, node)` each): a device per node, then `all`.
pub fn spec(nodes: &[(u32, DeviceNode)]) -> Spec {
    let one = |name: String, device_nodes: Vec<DeviceNode>| CdiDevice {
        name,
        container_edits: ContainerEdits { device_nodes },
    };
    let mut devices: Vec<CdiDevice> = nodes.iter().map(|(n, node)| one(n.to_string(), vec![node.clone()])).collect();
    devices.push(one("all".into(), nodes.iter().map(|(_, node)| node.clone()).collect()));
    Spec { cdi_version: CDI_VERSION, kind: KIND, devices }
}

pub fn run(a: &CdiArgs) -> Result<()> {
    let mut found = Vec::new();
    for path in nodes::device_nodes(&a.dev_dir)? {
        let n = crate::metrics::node_index(&path)
            .with_context(|| format!("{}: not a neuron_udma<N> node", path.display()))?;
        found.push((n, char_node(&path)?));
    }
    if found.is_empty() {
        bail!(nodes::no_node_message(&a.dev_dir));
    }
    let text = serde_json::to_string_pretty(&spec(&found))? + "\n";
    crate::metrics::emit(a.output.as_deref(), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u32) -> (u32, DeviceNode) {
        let path = format!("/dev/neuron_udma{n}");
        (n, DeviceNode { path, kind: "c", major: 10, minor: 120 + i64::from(n), permissions: "rw" })
    }

    /// The spec validates against CDI's JSON schema (schema.json and defs.json of
    /// cncf-tags/container-device-interface, in tests/cdi/; tests/cdi/README says which commit)
    /// and follows its parser's naming rules (pkg/parser/parser.go).
    #[test]
    fn spec_validates_against_the_cdi_schema() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdi");
        let load = |f: &str| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
        };
        let (schema, defs) = (load("schema.json"), load("defs.json"));
        let doc = serde_json::to_value(spec(&[node(0), node(1), node(2)])).unwrap();
        let mut errors = Vec::new();
        crate::jsonschema::validate(&doc, &schema, &schema, &defs, "$", &mut errors);
        assert!(errors.is_empty(), "{errors:#?}");
        // The schema's own fixtures: a good one passes, a bad one fails (the validator works).
        let good = load("good-minimal.json");
        let mut e = Vec::new();
        crate::jsonschema::validate(&good, &schema, &schema, &defs, "$", &mut e);
        assert!(e.is_empty(), "{e:#?}");
        let mut e = Vec::new();
        crate::jsonschema::validate(
            &serde_json::json!({"cdiVersion": "0.5.0", "kind": KIND}),
            &schema,
            &schema,
            &defs,
            "$",
            &mut e,
        );
        assert!(!e.is_empty(), "a spec without devices passed");

        // Names (parser.go): vendor and class start with a letter, end with a letter or digit,
        // and hold letters, digits, '_', '-', '.'; device names the same plus ':' and may start
        // with a digit.
        let (vendor, class) = KIND.split_once('/').unwrap();
        let ok = |s: &str, extra: &str, first_digit: bool| {
            let c0 = s.chars().next().unwrap();
            let cl = s.chars().last().unwrap();
            (c0.is_ascii_alphabetic() || (first_digit && c0.is_ascii_digit()))
                && cl.is_ascii_alphanumeric()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c) || extra.contains(c))
        };
        assert!(ok(vendor, "", false) && ok(class, "", false), "{KIND}");
        for d in doc["devices"].as_array().unwrap() {
            let name = d["name"].as_str().unwrap();
            assert!(ok(name, ":", true) && name.len() <= 63, "{name}");
        }
    }

    #[test]
    fn one_device_per_node_and_all() {
        let s = spec(&[node(0), node(3)]);
        let names: Vec<&str> = s.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["0", "3", "all"]);
        assert_eq!(s.devices[1].container_edits.device_nodes[0].path, "/dev/neuron_udma3");
        assert_eq!(s.devices[2].container_edits.device_nodes.len(), 2);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["devices"][0]["containerEdits"]["deviceNodes"][0]["type"], "c");
        assert_eq!(v["cdiVersion"], CDI_VERSION);
    }

    #[test]
    fn only_character_devices() {
        assert!(char_node(Path::new("/dev/null")).is_ok());
        assert!(char_node(Path::new("/")).is_err());
    }
}
