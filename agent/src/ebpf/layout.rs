//! The layout each pinned map must have for this agent to adopt it, and the check a starting
//! agent runs on the pins it finds (docs/ebpf.md, "Pinning and adoption").
//!
//! aya opens a pinned map by path without comparing it with the object's definition, so an
//! agent of another version (a key or value struct that grew, a capacity that changed, a map
//! that became per-CPU) would read and write the old map with the new layout. Before loading,
//! [`replace_mismatched`] compares every pinned map's kernel-reported type, key size, value
//! size and capacity with [`LAYOUTS`] (built from the same `warmpath-common` types and
//! consts the programs use) and unpins each map that differs, saying so in one log line:
//! aya then creates a fresh map of the right layout. The replaced map's entries are lost
//! (origins, exclusions, fail-open tables); the agent writes its own again at start. A change
//! that keeps every size but changes meaning must rename the map.

use std::{fs, mem::size_of, path::Path};

use aya::maps::{MapInfo, MapType};
use warmpath_common::{
    AFFINITY_CAPACITY, AFFINITY_MAP, AffinityKey, BACKENDS_CAPACITY, BACKENDS_MAP, Backends,
    CGROUP_STATS_CAPACITY, CGROUP_STATS_MAP, CONNS_CAPACITY, CONNS_MAP, COUNTERS_LEN, COUNTERS_MAP,
    CgroupStats, EXCLUDED_CAPACITY, EXCLUDED_MAP, Endpoint, FourTuple, HEARTBEAT_MAP,
    LISTENERS_CAPACITY, LISTENERS_MAP, ORIG_DST_MAP, Origin, RECENT_CAPACITY, RECENT_MAP, Recent,
    SERVICES_CAPACITY, SERVICES_MAP, STEER_MAP, Tracked,
};

use super::{Error, pinned::map_path};

/// What the kernel reports for a map, as far as adoption cares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    pub map_type: MapType,
    pub key_size: u32,
    /// Per CPU for per-CPU maps (as the kernel reports it).
    pub value_size: u32,
    pub max_entries: u32,
}

impl Layout {
    const fn new<K, V>(map_type: MapType, max_entries: u32) -> Self {
        Self {
            map_type,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
            max_entries,
        }
    }

    /// A pinned map's layout, from the kernel.
    pub fn of(info: &MapInfo) -> Result<Self, aya::maps::MapError> {
        Ok(Self {
            map_type: info.map_type()?,
            key_size: info.key_size(),
            value_size: info.value_size(),
            max_entries: info.max_entries(),
        })
    }

    /// How `found` differs from `self` (the wanted layout), or `None` when it does not.
    pub fn differences(&self, found: &Self) -> Option<String> {
        let mut out = Vec::new();
        if found.map_type != self.map_type {
            out.push(format!(
                "type {:?} (want {:?})",
                found.map_type, self.map_type
            ));
        }
        for (what, got, want) in [
            ("key", found.key_size, self.key_size),
            ("value", found.value_size, self.value_size),
        ] {
            if got != want {
                out.push(format!("{what} {got} B (want {want} B)"));
            }
        }
        if found.max_entries != self.max_entries {
            out.push(format!(
                "max entries {} (want {})",
                found.max_entries, self.max_entries
            ));
        }
        (!out.is_empty()).then(|| out.join(", "))
    }
}

/// Every map the object declares, with the layout its programs were compiled for (the same
/// types and capacities as `agent-ebpf/src/main.rs`; the root test `bpf_pins.rs` checks a
/// fresh load against this table).
pub const LAYOUTS: [(&str, Layout); 12] = [
    (
        SERVICES_MAP,
        Layout::new::<Endpoint, Endpoint>(MapType::Hash, SERVICES_CAPACITY),
    ),
    (
        ORIG_DST_MAP,
        // Socket storage: keyed by a socket (an fd from userspace, 4 bytes), no capacity.
        Layout::new::<i32, Tracked>(MapType::SkStorage, 0),
    ),
    (
        RECENT_MAP,
        Layout::new::<u32, Recent>(MapType::Array, RECENT_CAPACITY),
    ),
    (
        LISTENERS_MAP,
        Layout::new::<Endpoint, u32>(MapType::Hash, LISTENERS_CAPACITY),
    ),
    (
        CONNS_MAP,
        Layout::new::<FourTuple, Origin>(MapType::LruHash, CONNS_CAPACITY),
    ),
    (
        EXCLUDED_MAP,
        Layout::new::<u64, u32>(MapType::Hash, EXCLUDED_CAPACITY),
    ),
    (
        COUNTERS_MAP,
        Layout::new::<u32, u64>(MapType::PerCpuArray, COUNTERS_LEN),
    ),
    (HEARTBEAT_MAP, Layout::new::<u32, u64>(MapType::Array, 1)),
    (
        AFFINITY_MAP,
        Layout::new::<AffinityKey, Backends>(MapType::LruHash, AFFINITY_CAPACITY),
    ),
    (
        BACKENDS_MAP,
        Layout::new::<Endpoint, Backends>(MapType::Hash, BACKENDS_CAPACITY),
    ),
    (
        STEER_MAP,
        Layout::new::<Endpoint, u32>(MapType::Hash, SERVICES_CAPACITY),
    ),
    (
        CGROUP_STATS_MAP,
        Layout::new::<u64, CgroupStats>(MapType::LruPerCpuHash, CGROUP_STATS_CAPACITY),
    ),
];

/// The wanted layout of map `name`.
pub fn wanted(name: &str) -> Option<Layout> {
    LAYOUTS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// A pinned map that [`replace_mismatched`] unpinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    pub map: &'static str,
    /// What differed, e.g. `key 8 B (want 20 B)`.
    pub differences: String,
}

/// Unpins every map under `dir/maps` whose layout differs from [`LAYOUTS`] (one warning
/// each), so the load that follows creates it afresh. Maps that match, and missing ones, are
/// left as they are.
pub fn replace_mismatched(dir: &Path) -> Result<Vec<Replaced>, Error> {
    let mut replaced = Vec::new();
    for (name, want) in LAYOUTS {
        let path = map_path(dir, name);
        if !path.exists() {
            continue;
        }
        let map = |source| Error::Map { name, source };
        let found = Layout::of(&MapInfo::from_pin(&path).map_err(map)?).map_err(map)?;
        let Some(differences) = want.differences(&found) else {
            continue;
        };
        fs::remove_file(&path).map_err(|source| Error::Io {
            what: format!(
                "unpin {} (its layout differs: {differences}; `warmpath agent --cleanup` removes all pins)",
                path.display()
            ),
            source,
        })?;
        tracing::warn!(
            map = name,
            path = %path.display(),
            "pinned map has another layout ({differences}): replaced with a fresh one; its entries are lost"
        );
        replaced.push(Replaced {
            map: name,
            differences,
        });
    }
    Ok(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matching_layout_has_no_differences() {
        let want = wanted(SERVICES_MAP).unwrap();
        assert_eq!(want.differences(&want), None);
        assert_eq!(want.key_size, 20);
        assert_eq!(want.value_size, 20);
        assert_eq!(want.max_entries, 4096);
    }

    #[test]
    fn every_difference_is_named_with_the_wanted_value() {
        let want = wanted(CGROUP_STATS_MAP).unwrap();
        assert_eq!(
            (want.key_size, want.value_size, want.max_entries),
            (8, 40, 16_384)
        );
        let found = Layout {
            map_type: MapType::LruHash,
            key_size: 8,
            value_size: 24,
            max_entries: 1024,
        };
        assert_eq!(
            want.differences(&found).as_deref(),
            Some(
                "type LruHash (want LruPerCpuHash), value 24 B (want 40 B), max entries 1024 (want 16384)"
            )
        );
    }

    #[test]
    fn the_table_names_every_map_once() {
        let mut names: Vec<&str> = LAYOUTS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), LAYOUTS.len());
        assert_eq!(super::super::pinned::MAPS.len(), LAYOUTS.len());
        for name in super::super::pinned::MAPS {
            assert!(wanted(name).is_some(), "{name} has no layout");
        }
    }
}
