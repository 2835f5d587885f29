// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `--json` output of `info`, `list`, `queue-state` and `top`: the fields of the text
//! output as serde structs (numbers as JSON numbers).

use neuron_udma::{DeviceUsage, Info, QueueState, RingState};
use serde::Serialize;

/// NEURON_UDMA_INFO with what udmactl derives from it.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct InfoJson {
    /// "trn1", "inf2", "trn2", or null for an unknown device id.
    pub model: Option<&'static str>,
    pub abi_version: u32,
    pub generation: u32,
    pub vendor_id: u16,
    pub device_id: u16,
    pub engines: u32,
    pub queues_per_engine: u32,
    pub max_copy_size: u32,
    pub device_mem_size: u64,
    pub min_ring_descs: u32,
    pub max_ring_descs: u32,
    pub ring_reserve_descs: u32,
    pub max_batch: u32,
    pub max_host_buffer: u64,
    pub max_import_size: u64,
    /// How many engines reach host memory (the popcount of the bitmap).
    pub host_engine_count: usize,
    /// The engines that reach host memory (user queues exist only on these), ascending.
    pub host_engines: Vec<u32>,
    /// The raw `host_engines` words of INFO (bit e % 64 of word e / 64), as "0x..." strings:
    /// a 64-bit word does not fit the 53 bits a JSON number keeps in most parsers.
    pub host_engines_bitmap: Vec<String>,
    /// The driver's own H2T queues (QUEUE_INIT of them is EBUSY).
    pub driver_h2t_queues: Vec<QueueId>,
    /// ABI 3 (0 from an older driver): live buffers one file may hold.
    pub max_buffers: u32,
    /// ABI 3 (0 before): fences in flight on one queue (COPY_SUBMIT is EBUSY past it).
    pub max_queue_fences: u32,
    /// ABI 3 (empty before): the engines whose queues may keep their rings in device memory.
    pub device_ring_engines: Vec<u32>,
    /// The raw `device_ring_engines` words of INFO, as "0x..." strings.
    pub device_ring_engines_bitmap: Vec<String>,
    /// ABI 3: the device's NUMA node, -1 when the kernel knows none (0 from a driver before
    /// the field).
    pub numa_node: i32,
}

/// One (engine, queue) pair.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueId {
    pub engine: u32,
    pub queue: u32,
}

impl InfoJson {
    pub fn new(i: &Info) -> Self {
        let host_engines = i.host_engine_list();
        InfoJson {
            model: i.model(),
            abi_version: i.abi_version,
            generation: i.generation,
            vendor_id: i.vendor_id,
            device_id: i.device_id,
            engines: i.engines,
            queues_per_engine: i.queues_per_engine,
            max_copy_size: i.max_copy_size,
            device_mem_size: i.device_mem_size,
            min_ring_descs: i.min_ring_descs,
            max_ring_descs: i.max_ring_descs,
            ring_reserve_descs: i.ring_reserve_descs,
            max_batch: i.max_batch,
            max_host_buffer: i.max_host_buffer,
            max_import_size: i.max_import_size,
            host_engine_count: host_engines.len(),
            host_engines,
            host_engines_bitmap: i.host_engines.iter().map(|w| format!("{w:#018x}")).collect(),
            driver_h2t_queues: i.h2t_queues().iter().map(|&(engine, queue)| QueueId { engine, queue }).collect(),
            max_buffers: i.max_buffers,
            max_queue_fences: i.max_queue_fences,
            device_ring_engines: i.device_ring_engine_list(),
            device_ring_engines_bitmap: i.device_ring_engines.iter().map(|w| format!("{w:#018x}")).collect(),
            numa_node: i.numa_node,
        }
    }
}

/// `info --json`: the node, its INFO and its device's usage counters.
#[derive(Serialize, Debug)]
pub struct DeviceInfo {
    pub device: String,
    #[serde(flatten)]
    pub info: InfoJson,
    /// The PCI device (the file's fdinfo `neuron_udma-device`), null from an older driver.
    pub pci_device: Option<String>,
    /// The queues the driver's in-kernel dmaengine channels hold (QUEUE_INIT of them is
    /// EBUSY), from the channels in sysfs; null when they cannot be read.
    pub dmaengine_queues: Option<Vec<QueueId>>,
    /// The device's usage counters (sysfs), null when they cannot be read.
    pub usage: Option<DeviceUsageJson>,
    /// Why `usage` is null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_error: Option<String>,
}

/// The usage counters of a device, named as their sysfs files
/// (Documentation/ABI/testing/sysfs-driver-neuron_udma).
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsageJson {
    pub mem_host_bytes: u64,
    pub mem_device_bytes: u64,
    pub mem_imported_bytes: u64,
    pub mem_host_peak_bytes: u64,
    pub mem_device_peak_bytes: u64,
    pub mem_imported_peak_bytes: u64,
    pub mem_device_total_bytes: u64,
    pub mem_device_stranded_bytes: u64,
}

impl From<&DeviceUsage> for DeviceUsageJson {
    fn from(u: &DeviceUsage) -> Self {
        DeviceUsageJson {
            mem_host_bytes: u.host_bytes,
            mem_device_bytes: u.device_bytes,
            mem_imported_bytes: u.imported_bytes,
            mem_host_peak_bytes: u.host_peak_bytes,
            mem_device_peak_bytes: u.device_peak_bytes,
            mem_imported_peak_bytes: u.imported_peak_bytes,
            mem_device_total_bytes: u.device_total_bytes,
            mem_device_stranded_bytes: u.device_stranded_bytes,
        }
    }
}

/// One node of `list --json`: its INFO, or why it could not be read.
#[derive(Serialize, Debug)]
pub struct ListEntry {
    pub device: String,
    #[serde(flatten)]
    pub info: Option<InfoJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

impl ListEntry {
    pub fn new(device: &str, probe: &crate::nodes::Probe) -> Self {
        let device = device.to_string();
        match probe {
            Ok(i) => ListEntry { device, info: Some(InfoJson::new(i)), error: None, errno: None },
            Err((msg, errno)) => ListEntry { device, info: None, error: Some(msg.clone()), errno: Some(*errno) },
        }
    }
}

/// One ring of `queue-state --json`.
#[derive(Serialize, Debug)]
pub struct RingJson {
    pub hw_cfg: u32,
    pub hw_status: u32,
    pub hw_len: u32,
    pub hw_head: u32,
    pub hw_tail: u32,
    pub hw_comp_head: u32,
    pub sw_next: u32,
    pub sw_ack: u32,
    pub sw_ring_id: u32,
    pub sw_available: u32,
    pub sw_pending: u32,
    pub size: u32,
}

impl From<&RingState> for RingJson {
    fn from(r: &RingState) -> Self {
        RingJson {
            hw_cfg: r.hw_cfg,
            hw_status: r.hw_status,
            hw_len: r.hw_len,
            hw_head: r.hw_head,
            hw_tail: r.hw_tail,
            hw_comp_head: r.hw_comp_head,
            sw_next: r.sw_next,
            sw_ack: r.sw_ack,
            sw_ring_id: r.sw_ring_id,
            sw_available: r.sw_available,
            sw_pending: r.sw_pending,
            size: r.size,
        }
    }
}

/// `queue-state --json`: NEURON_UDMA_QUEUE_STATE of one queue.
#[derive(Serialize, Debug)]
pub struct QueueStateJson {
    pub device: String,
    pub engine: u32,
    pub queue: u32,
    pub m2s_engine_state: u32,
    pub s2m_engine_state: u32,
    pub m2s_error_cause: u32,
    pub s2m_error_cause: u32,
    pub resets: u32,
    pub tx: RingJson,
    pub rx: RingJson,
}

impl QueueStateJson {
    pub fn new(device: &str, s: &QueueState) -> Self {
        QueueStateJson {
            device: device.to_string(),
            engine: s.engine,
            queue: s.queue,
            m2s_engine_state: s.m2s_engine_state,
            s2m_engine_state: s.s2m_engine_state,
            m2s_error_cause: s.m2s_error_cause,
            s2m_error_cause: s.s2m_error_cause,
            resets: s.resets,
            tx: (&s.tx).into(),
            rx: (&s.rx).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn trn1() -> Info {
        Info {
            abi_version: 2,
            generation: 2,
            vendor_id: 0x1d0f,
            device_id: 0x7164,
            engines: 34,
            queues_per_engine: 16,
            max_copy_size: 65536,
            device_mem_size: 240 << 20,
            min_ring_descs: 32,
            max_ring_descs: 1 << 23,
            ring_reserve_descs: 16,
            max_batch: 4096,
            max_host_buffer: 4 << 20,
            host_engines: [(1 << 34) - 1, 0, 0],
            max_import_size: 1 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn info_serialises_every_field_as_a_number() {
        let usage = DeviceUsage { host_bytes: 4096, device_total_bytes: 240 << 20, ..Default::default() };
        let v = serde_json::to_value(DeviceInfo {
            device: "/dev/neuron_udma0".into(),
            info: InfoJson::new(&trn1()),
            pci_device: Some("0000:00:03.0".into()),
            dmaengine_queues: Some(vec![QueueId { engine: 33, queue: 15 }]),
            usage: Some((&usage).into()),
            usage_error: None,
        })
        .unwrap();
        assert_eq!(
            v,
            json!({
                "device": "/dev/neuron_udma0",
                "model": "trn1",
                "abi_version": 2,
                "generation": 2,
                "vendor_id": 0x1d0f,
                "device_id": 0x7164,
                "engines": 34,
                "queues_per_engine": 16,
                "max_copy_size": 65536,
                "device_mem_size": 240u64 << 20,
                "min_ring_descs": 32,
                "max_ring_descs": 1 << 23,
                "ring_reserve_descs": 16,
                "max_batch": 4096,
                "max_host_buffer": 4 << 20,
                "max_import_size": 1u64 << 30,
                "host_engine_count": 34,
                "host_engines": (0..34).collect::<Vec<u32>>(),
                "host_engines_bitmap": ["0x00000003ffffffff", "0x0000000000000000", "0x0000000000000000"],
                "driver_h2t_queues": [{"engine": 32, "queue": 0}, {"engine": 33, "queue": 0}],
                "max_buffers": 0,
                "max_queue_fences": 0,
                "device_ring_engines": [],
                "device_ring_engines_bitmap": ["0x0000000000000000", "0x0000000000000000", "0x0000000000000000"],
                "numa_node": 0,
                "pci_device": "0000:00:03.0",
                "dmaengine_queues": [{"engine": 33, "queue": 15}],
                "usage": {
                    "mem_host_bytes": 4096,
                    "mem_device_bytes": 0,
                    "mem_imported_bytes": 0,
                    "mem_host_peak_bytes": 0,
                    "mem_device_peak_bytes": 0,
                    "mem_imported_peak_bytes": 0,
                    "mem_device_total_bytes": 240u64 << 20,
                    "mem_device_stranded_bytes": 0,
                },
            })
        );
    }

    #[test]
    fn info_without_counters() {
        let v = serde_json::to_value(DeviceInfo {
            device: "/dev/neuron_udma0".into(),
            info: InfoJson::new(&trn1()),
            pci_device: None,
            dmaengine_queues: None,
            usage: None,
            usage_error: Some("no neuron_udma usage counters".into()),
        })
        .unwrap();
        assert_eq!((&v["pci_device"], &v["usage"]), (&Value::Null, &Value::Null));
        assert_eq!(v["dmaengine_queues"], Value::Null);
        assert_eq!(v["usage_error"], "no neuron_udma usage counters");
    }

    #[test]
    fn abi3_fields() {
        let mut i = trn1();
        i.abi_version = 3;
        i.max_buffers = 4096;
        i.max_queue_fences = 256;
        i.device_ring_engines = [(1 << 34) - 1, 0, 0];
        let v = serde_json::to_value(InfoJson::new(&i)).unwrap();
        assert_eq!((v["max_buffers"].as_u64(), v["max_queue_fences"].as_u64()), (Some(4096), Some(256)));
        assert_eq!(v["device_ring_engines"].as_array().unwrap().len(), 34);
        assert_eq!(v["device_ring_engines_bitmap"][0], "0x00000003ffffffff");
    }

    #[test]
    fn trn2_host_engines_and_unknown_model() {
        let mut i = trn1();
        i.device_id = 0x7364;
        i.generation = 3;
        i.engines = 132;
        i.host_engines = [0xF0F0_F0F0_F0F0_F0F0, 0xF0F0_F0F0_F0F0_F0F0, 0xF];
        let j = InfoJson::new(&i);
        assert_eq!(j.model, Some("trn2"));
        assert_eq!(j.host_engine_count, 68);
        assert_eq!(j.host_engines_bitmap[0], "0xf0f0f0f0f0f0f0f0");
        assert_eq!(j.driver_h2t_queues.len(), 8);
        i.device_id = 0x1234;
        assert_eq!(serde_json::to_value(InfoJson::new(&i)).unwrap()["model"], Value::Null);
    }

    #[test]
    fn list_entries() {
        let ok = serde_json::to_value(ListEntry::new("/dev/neuron_udma0", &Ok(trn1()))).unwrap();
        assert_eq!(ok["device"], "/dev/neuron_udma0");
        assert_eq!(ok["engines"], 34);
        assert!(ok.get("error").is_none() && ok.get("errno").is_none());
        let denied = Err(("cannot open: Permission denied (EACCES)".to_string(), libc::EACCES));
        let bad = serde_json::to_value(ListEntry::new("/dev/neuron_udma1", &denied)).unwrap();
        assert_eq!(
            bad,
            json!({"device": "/dev/neuron_udma1", "error": "cannot open: Permission denied (EACCES)", "errno": 13})
        );
    }

    #[test]
    fn queue_state() {
        let mut s = QueueState { engine: 4, queue: 1, resets: 2, ..Default::default() };
        s.tx.size = 4096;
        s.rx.sw_pending = 3;
        let v = serde_json::to_value(QueueStateJson::new("/dev/neuron_udma0", &s)).unwrap();
        assert_eq!(v["engine"], 4);
        assert_eq!(v["resets"], 2);
        assert_eq!(v["tx"]["size"], 4096);
        assert_eq!(v["rx"]["sw_pending"], 3);
        assert_eq!(v["tx"].as_object().unwrap().len(), 12);
    }
}
