//! The pairing half of a replay: which open allocation each event touches, found by
//! address in trace order as the official viewer pairs them (spec 3.5, 6.2).
//!
//! Takes a run of events of a device's trace, with the replay's [`BlockBytes`], and gives, per event, the slot of the
//! allocation it opens or touches, with the version at its address and its block bytes
//! where the event makes a lifetime. It keeps the open allocations by address from one
//! run to the next, so the engine ([`super::replay`]) can run it a chunk ahead on a
//! second thread. It knows nothing of totals or aggregators: the engine's other half
//! turns its slots into lifetimes.

use crate::model::Action;
use crate::model::frames::FxMap;
use crate::model::trace::DeviceTrace;

/// What pairing asks of the replay it runs in ([`super::replay::DeviceReplay`]): the
/// block bytes of an allocation.
pub(super) trait BlockBytes {
    /// Block bytes of the allocation of `size` bytes made at `alloc` (None: before the
    /// trace) at `addr`.
    fn block_bytes_at(&self, alloc: Option<usize>, addr: u64, size: u64) -> u64;
    /// Block bytes of a request that holds no final block.
    fn rounded(&self, size: u64) -> u64;
}

/// No open allocation.
pub(super) const NO_SLOT: u32 = u32::MAX;

/// The half of a replay that pairs each free with its allocation by address. Open
/// allocations are numbered by slot, and slots given back by completed frees are reused
/// last first, so the other half keeps its open lifetimes in a vector whose recent slots
/// are in cache, while the map by address (the part with random access) stays small.
pub(super) struct Pairing {
    /// address -> slot of the allocation open there
    pub(super) open: FxMap<u64, u32>,
    pub(super) free_slots: Vec<u32>,
    slots: u32,
    /// Frees completed at each address, when versions are counted.
    pub(super) versions: Option<FxMap<u64, u32>>,
}

/// What pairing found for one event: the slot of the allocation it opens or touches
/// (`NO_SLOT`: none), and for an `alloc` or an orphan `free_completed`, the version at
/// its address and its block bytes.
#[derive(Clone, Copy)]
pub(super) struct Paired {
    pub(super) slot: u32,
    pub(super) version: u32,
    pub(super) block: u64,
}

/// The pairs of a run of events, from `start` on.
pub(super) struct PairedRun {
    pub(super) start: usize,
    pub(super) pairs: Vec<Paired>,
}

impl Pairing {
    pub(super) fn new(track_versions: bool) -> Self {
        Pairing {
            open: FxMap::default(),
            free_slots: Vec::new(),
            slots: 0,
            versions: track_versions.then(FxMap::default),
        }
    }

    pub(super) fn pair(
        &mut self,
        trace: &DeviceTrace,
        r: &impl BlockBytes,
        range: std::ops::Range<usize>,
    ) -> PairedRun {
        let start = range.start;
        let pairs = range
            .map(|i| match trace.action(i) {
                Action::Alloc => {
                    let addr = trace.addr(i);
                    let slot = self.free_slots.pop().unwrap_or_else(|| {
                        self.slots += 1;
                        self.slots - 1
                    });
                    // An allocation open at the same address keeps its slot to the end:
                    // the viewer keeps it alive.
                    self.open.insert(addr, slot);
                    let version = self
                        .versions
                        .as_ref()
                        .and_then(|v| v.get(&addr).copied())
                        .unwrap_or(0);
                    let block = r.block_bytes_at(Some(i), addr, trace.size(i));
                    Paired {
                        slot,
                        version,
                        block,
                    }
                }
                Action::FreeRequested => Paired {
                    slot: self.open.get(&trace.addr(i)).copied().unwrap_or(NO_SLOT),
                    version: 0,
                    block: 0,
                },
                Action::FreeCompleted => {
                    let addr = trace.addr(i);
                    let version = match &mut self.versions {
                        Some(v) => {
                            let count = v.entry(addr).or_insert(0);
                            *count += 1;
                            *count - 1
                        }
                        None => 0,
                    };
                    match self.open.remove(&addr) {
                        Some(slot) => {
                            self.free_slots.push(slot);
                            Paired {
                                slot,
                                version,
                                block: 0,
                            }
                        }
                        // Allocated before the trace.
                        None => Paired {
                            slot: NO_SLOT,
                            version,
                            block: r.rounded(trace.size(i)),
                        },
                    }
                }
                _ => Paired {
                    slot: NO_SLOT,
                    version: 0,
                    block: 0,
                },
            })
            .collect();
        PairedRun { start, pairs }
    }
}
