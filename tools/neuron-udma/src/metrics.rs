// SPDX-License-Identifier: MIT OR Apache-2.0
//! The devices' counters in the Prometheus text exposition format (version 0.0.4, not
//! OpenMetrics: a counter's TYPE line names it with its `_total`), as
//! node_exporter's textfile collector, the OpenTelemetry collector's Prometheus receiver and
//! the CloudWatch agent read it: per metric one `# HELP` and one `# TYPE` line, then one sample
//! per device labelled `device` (the node's number, `/dev/neuron_udma<N>`) and `pci` (the PCI
//! address). Counters end in `_total`, byte gauges in `_bytes`. `udmactl metrics` writes it.
//!
//! ```
//! use neuron_udma::metrics::{prometheus_text, DeviceMetrics};
//! let text = prometheus_text(&[DeviceMetrics { index: 0, pci: "0000:00:03.0".into(), ..Default::default() }]);
//! assert!(text.contains("neuron_udma_copies_total{device=\"0\",pci=\"0000:00:03.0\"} 0\n"));
//! ```

use std::fmt::Write as _;

use crate::usage::{DeviceActivity, DeviceUsage};

/// What one device reports: its node's number, its PCI address and its counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMetrics {
    /// N of `/dev/neuron_udma<N>`.
    pub index: u32,
    /// The PCI address (e.g. `0000:00:03.0`).
    pub pci: String,
    /// Memory held by the buffers of every file.
    pub usage: DeviceUsage,
    /// Activity since the device was bound.
    pub activity: DeviceActivity,
}

/// One metric: its name, type, help text, and per device its samples (extra labels, value).
struct Metric {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: fn(&DeviceMetrics) -> Vec<(&'static str, u64)>,
}

const METRICS: &[Metric] = &[
    Metric {
        name: "neuron_udma_copies_total",
        kind: "counter",
        help:
            "Copies user space submitted (COPY_PREPARE entries, COPY_PREPARE_ONE, URING_COPY entries, MEMCPY, MEMSET).",
        samples: |d| vec![("", d.activity.copies)],
    },
    Metric {
        name: "neuron_udma_copy_bytes_total",
        kind: "counter",
        help: "Bytes of the copies user space submitted.",
        samples: |d| vec![("", d.activity.copy_bytes)],
    },
    Metric {
        name: "neuron_udma_fences_completed_total",
        kind: "counter",
        help: "Fences retired as done, on every queue of the device.",
        samples: |d| vec![("", d.activity.fences_completed)],
    },
    Metric {
        name: "neuron_udma_fences_failed_total",
        kind: "counter",
        help: "Fences a queue reset failed (engine error, timeout, device reset).",
        samples: |d| vec![("", d.activity.fences_failed)],
    },
    Metric {
        name: "neuron_udma_queue_resets_total",
        kind: "counter",
        help:
            "Queue resets, by cause (engine_error, timeout, device: a device reset, other: a dmaengine terminate or a revoked import's drain).",
        samples: |d| {
            vec![
                ("cause=\"engine_error\"", d.activity.queue_resets_engine_error),
                ("cause=\"timeout\"", d.activity.queue_resets_timeout),
                ("cause=\"device\"", d.activity.queue_resets_device),
                ("cause=\"other\"", d.activity.queue_resets_other),
            ]
        },
    },
    Metric {
        name: "neuron_udma_device_resets_total",
        kind: "counter",
        help: "Device resets: function-level resets and PCI error recoveries.",
        samples: |d| vec![("", d.activity.device_resets)],
    },
    Metric {
        name: "neuron_udma_engine_aborts_total",
        kind: "counter",
        help: "Engine aborts a queue found.",
        samples: |d| vec![("", d.activity.engine_aborts)],
    },
    Metric {
        name: "neuron_udma_ring_memory_bytes",
        kind: "gauge",
        help: "Memory of the queues in use, by memory (host, device).",
        samples: |d| {
            vec![("memory=\"host\"", d.activity.ring_host_bytes), ("memory=\"device\"", d.activity.ring_device_bytes)]
        },
    },
    Metric {
        name: "neuron_udma_buffer_memory_bytes",
        kind: "gauge",
        help: "Memory held by the buffers of every open file, by type.",
        samples: |d| {
            vec![
                ("type=\"host\"", d.usage.host_bytes),
                ("type=\"device\"", d.usage.device_bytes),
                ("type=\"imported\"", d.usage.imported_bytes),
            ]
        },
    },
    Metric {
        name: "neuron_udma_buffer_memory_peak_bytes",
        kind: "gauge",
        help: "The largest value of neuron_udma_buffer_memory_bytes since the device was bound, by type.",
        samples: |d| {
            vec![
                ("type=\"host\"", d.usage.host_peak_bytes),
                ("type=\"device\"", d.usage.device_peak_bytes),
                ("type=\"imported\"", d.usage.imported_peak_bytes),
            ]
        },
    },
    Metric {
        name: "neuron_udma_device_memory_total_bytes",
        kind: "gauge",
        help: "Device memory available to device buffers.",
        samples: |d| vec![("", d.usage.device_total_bytes)],
    },
    Metric {
        name: "neuron_udma_device_memory_stranded_bytes",
        kind: "gauge",
        help: "Device memory kept reserved for dma-buf exports of an earlier binding that a pinned importer may still reach.",
        samples: |d| vec![("", d.usage.device_stranded_bytes)],
    },
];

/// A label value escaped as the format requires (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The counters of `devices` in the Prometheus text format: every metric's `# HELP` and
/// `# TYPE` lines, then its samples for each device in the order given. Ends with a newline.
pub fn prometheus_text(devices: &[DeviceMetrics]) -> String {
    let mut out = String::new();
    for m in METRICS {
        // Infallible: writing to a String.
        let _ = writeln!(out, "# HELP {} {}", m.name, m.help);
        let _ = writeln!(out, "# TYPE {} {}", m.name, m.kind);
        for d in devices {
            for (extra, value) in (m.samples)(d) {
                let sep = if extra.is_empty() { "" } else { "," };
                let _ = writeln!(
                    out,
                    "{}{{device=\"{}\",pci=\"{}\"{sep}{extra}}} {value}",
                    m.name,
                    d.index,
                    escape(&d.pci)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_devices() -> Vec<DeviceMetrics> {
        let usage = DeviceUsage {
            host_bytes: 65536,
            device_bytes: 1 << 20,
            imported_bytes: 8192,
            host_peak_bytes: 131072,
            device_peak_bytes: 2 << 20,
            imported_peak_bytes: 8192,
            device_total_bytes: 48 << 20,
            device_stranded_bytes: 1 << 20,
        };
        let activity = DeviceActivity {
            copies: 15,
            copy_bytes: 9658,
            fences_completed: 11,
            fences_failed: 3,
            queue_resets_engine_error: 3,
            queue_resets_timeout: 1,
            queue_resets_other: 2,
            engine_aborts: 3,
            ring_host_bytes: 925696,
            ring_device_bytes: 0,
            queue_resets_device: 7,
            device_resets: 1,
        };
        vec![
            DeviceMetrics { index: 0, pci: "0000:00:03.0".into(), usage, activity },
            DeviceMetrics { index: 1, pci: "0000:00:04.0".into(), ..Default::default() },
        ]
    }

    /// The whole output against the golden file (regenerate it with
    /// `UPDATE_GOLDEN=1 cargo test -p neuron-udma metrics`).
    #[test]
    fn golden() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/metrics.prom");
        let text = prometheus_text(&two_devices());
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        assert_eq!(text, std::fs::read_to_string(&path).unwrap());
    }

    /// The exposition format's rules, checked line by line: HELP then TYPE once per metric
    /// before its samples, counters named `_total`, one sample per label set, names and labels
    /// of the allowed characters, values integers.
    #[test]
    fn format_rules() {
        let text = prometheus_text(&two_devices());
        assert!(text.ends_with('\n'));
        let mut seen = std::collections::HashSet::new();
        let name_ok = |n: &str| {
            n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let help = lines[i].strip_prefix("# HELP ").expect("a metric starts with # HELP");
            let (name, _) = help.split_once(' ').unwrap();
            let ty = lines[i + 1].strip_prefix(&format!("# TYPE {name} ")).expect("# TYPE after # HELP");
            assert!(["counter", "gauge"].contains(&ty));
            assert!(name_ok(name), "{name}");
            assert_eq!(ty == "counter", name.ends_with("_total"), "{name}");
            assert!(seen.insert(name.to_string()), "{name} twice");
            i += 2;
            while i < lines.len() && !lines[i].starts_with('#') {
                let (series, value) = lines[i].rsplit_once(' ').unwrap();
                value.parse::<u64>().unwrap();
                let (n, labels) = series.split_once('{').unwrap();
                assert_eq!(n, name);
                let labels = labels.strip_suffix('}').unwrap();
                for l in labels.split(',') {
                    let (k, v) = l.split_once('=').unwrap();
                    assert!(name_ok(k) && v.starts_with('"') && v.ends_with('"'), "{l}");
                }
                assert!(labels.starts_with("device=\"") && labels.contains(",pci=\"0000:"));
                assert!(seen.insert(series.to_string()), "{series} twice");
                i += 1;
            }
        }
        assert_eq!(seen.iter().filter(|s| !s.contains('{')).count(), METRICS.len());
    }

    #[test]
    fn labels_are_escaped() {
        let d = DeviceMetrics { pci: "a\"b\\c\nd".into(), ..Default::default() };
        assert!(prometheus_text(&[d]).contains("pci=\"a\\\"b\\\\c\\nd\""));
    }
}
