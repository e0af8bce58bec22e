//! What `cudaMalloc` answers in a what-if: memory up to a capacity, at addresses of the
//! model's own (spec 4.2: where `cudaMalloc` places a segment is unknowable, so new
//! segments go above every address in use, in order).

use super::model::Device;

/// Addresses of new segments are aligned to this and kept this far apart, so that no
/// two segments touch.
const ALIGN: u64 = 2 << 20;

/// A device with `capacity` bytes for the allocator (None: unlimited) and a bump
/// allocator of addresses starting at `next`.
#[derive(Clone, Debug)]
pub struct CapacityDevice {
    pub capacity: Option<u64>,
    next: u64,
    /// The most the allocator asked to hold (reserved + the new memory) since reset.
    pub max_need: u64,
}

impl CapacityDevice {
    /// New segments start above `above` (the highest address the state uses).
    pub fn new(capacity: Option<u64>, above: u64) -> CapacityDevice {
        CapacityDevice {
            capacity,
            max_need: 0,
            next: above
                .div_ceil(ALIGN)
                .saturating_add(1)
                .saturating_mul(ALIGN)
                .max(1 << 32),
        }
    }

    fn fits(&mut self, size: u64, reserved: u64) -> bool {
        self.max_need = self.max_need.max(reserved.saturating_add(size));
        self.capacity
            .is_none_or(|c| reserved.saturating_add(size) <= c)
    }

    fn bump(&mut self, size: u64) -> u64 {
        let addr = self.next;
        self.next = self
            .next
            .saturating_add(size.div_ceil(ALIGN).saturating_mul(ALIGN))
            .saturating_add(ALIGN);
        addr
    }
}

impl Device for CapacityDevice {
    fn cuda_malloc(&mut self, size: u64, reserved: u64, _released: usize) -> Option<u64> {
        self.fits(size, reserved).then(|| self.bump(size))
    }

    fn map(&mut self, _addr: u64, size: u64, reserved: u64, _released: usize) -> bool {
        self.fits(size, reserved)
    }

    fn reserve(&mut self, size: u64) -> u64 {
        self.bump(size)
    }
}
