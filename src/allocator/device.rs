//! What `cudaMalloc` answers in a what-if: memory up to a capacity, at the addresses the
//! recording shows while the scenario makes the recording's calls to the device, and at
//! addresses of the model's own after (spec 4.2: where `cudaMalloc` places a segment
//! the recording does not show is unknowable, so new segments go above every address in
//! use, in order).

use super::model::Device;
use super::requests::Recorded;
use crate::model::Action;

/// Addresses of new segments are aligned to this and kept this far apart, so that no
/// two segments touch.
const ALIGN: u64 = 2 << 20;

/// Where segments the recording does not show go: above every address the recording
/// uses, upwards; where the 64-bit space above runs out (a recording near its top),
/// below the lowest address it uses, downwards; where both run out, from the first
/// address above again, and `reused` says so (two segments may then share addresses:
/// the answer is an estimate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressSpace {
    /// The next address upwards (None: no room left above).
    up: Option<u64>,
    /// The lowest address taken downwards (the recording's lowest at first).
    down: u64,
    /// Where the upward run started.
    first: Option<u64>,
    pub reused: bool,
}

impl AddressSpace {
    /// The space around addresses in use from `lowest` to `highest` (an end: the byte
    /// after the last), upwards from above 4 GiB at least.
    pub fn around(lowest: u64, highest: u64) -> AddressSpace {
        let first = highest
            .div_ceil(ALIGN)
            .checked_add(1)
            .and_then(|n| n.checked_mul(ALIGN))
            .map(|a| a.max(1 << 32));
        AddressSpace::with_first(lowest, first)
    }

    /// As [`AddressSpace::around`], with the upward run starting at `first` exactly.
    pub fn starting_at(lowest: u64, first: u64) -> AddressSpace {
        AddressSpace::with_first(lowest, Some(first))
    }

    /// Upwards from `first` (None: no room above), downwards from `lowest`.
    fn with_first(lowest: u64, first: Option<u64>) -> AddressSpace {
        AddressSpace {
            up: first,
            down: lowest.min(first.unwrap_or(u64::MAX)) / ALIGN * ALIGN,
            first,
            reused: false,
        }
    }

    /// The address of a new segment of `size` bytes.
    pub fn take(&mut self, size: u64) -> u64 {
        let span = size.div_ceil(ALIGN).saturating_mul(ALIGN);
        let upwards = |at: Option<u64>| {
            let a = at?;
            let next = a.checked_add(span)?.checked_add(ALIGN)?;
            Some((a, next))
        };
        if let Some((a, next)) = upwards(self.up) {
            self.up = Some(next);
            return a;
        }
        if let Some(a) = self
            .down
            .checked_sub(span)
            .and_then(|a| a.checked_sub(ALIGN))
            .filter(|&a| a >= ALIGN)
        {
            self.down = a;
            return a;
        }
        self.reused = true;
        match upwards(self.first) {
            Some((a, next)) => {
                self.up = Some(next);
                a
            }
            None => self.first.unwrap_or(ALIGN),
        }
    }
}

/// A device with `capacity` bytes for the allocator (None: unlimited) that places new
/// segments in `space`.
#[derive(Clone, Debug)]
pub struct CapacityDevice {
    pub capacity: Option<u64>,
    pub space: AddressSpace,
    /// The most the allocator asked to hold (reserved + the new memory) since reset.
    pub max_need: u64,
    /// Whether every call to the device so far was the recording's, so that the device
    /// answers as the recording shows ([`Following`]).
    pub in_step: bool,
}

impl CapacityDevice {
    /// New segments go into `space`.
    pub fn new(capacity: Option<u64>, space: AddressSpace) -> CapacityDevice {
        CapacityDevice {
            capacity,
            max_need: 0,
            in_step: false,
            space,
        }
    }

    fn fits(&mut self, size: u64, reserved: u64) -> bool {
        self.max_need = self.max_need.max(reserved.saturating_add(size));
        self.capacity
            .is_none_or(|c| reserved.saturating_add(size) <= c)
    }

    fn bump(&mut self, size: u64) -> u64 {
        self.space.take(size)
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

/// The device for one allocator call whose recording shows `outs` (its `segment_*`
/// entries): while the scenario is in step, a segment the recording made at this point
/// of the call, of the same size, gets the recorded address; any other call puts the
/// device out of step for good. The capacity decides success either way.
pub struct Following<'a> {
    pub dev: &'a mut CapacityDevice,
    pub outs: &'a [Recorded],
    /// Segments made (or ranges mapped) by the call so far.
    pub made: usize,
}

impl Following<'_> {
    /// The recorded entry this call's next growth is, where it is one of `action`.
    fn recorded(&self, action: Action, released: usize) -> Option<&Recorded> {
        let r = self.outs.get(self.made + released)?;
        (self.dev.in_step && r.action == action).then_some(r)
    }
}

impl Device for Following<'_> {
    fn cuda_malloc(&mut self, size: u64, reserved: u64, released: usize) -> Option<u64> {
        if !self.dev.fits(size, reserved) {
            return None;
        }
        let addr = match self.recorded(Action::SegmentAlloc, released) {
            Some(r) if r.size == size => r.addr,
            _ => {
                self.dev.in_step = false;
                self.dev.bump(size)
            }
        };
        self.made += 1;
        Some(addr)
    }

    fn map(&mut self, addr: u64, size: u64, reserved: u64, released: usize) -> bool {
        if !self.dev.fits(size, reserved) {
            return false;
        }
        if !self
            .recorded(Action::SegmentMap, released)
            .is_some_and(|r| r.addr == addr && r.size == size)
        {
            self.dev.in_step = false;
        }
        self.made += 1;
        true
    }

    fn reserve(&mut self, size: u64) -> u64 {
        let first_map = self.outs[self.made.min(self.outs.len())..]
            .iter()
            .find(|r| r.action == Action::SegmentMap);
        match first_map {
            Some(r) if self.dev.in_step => r.addr,
            _ => {
                self.dev.in_step = false;
                self.dev.bump(size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn seg(action: Action, addr: u64, size: u64) -> Recorded {
        Recorded {
            action,
            addr,
            size,
            stream: 0,
            event: 0,
        }
    }

    /// In step, a segment of the recorded size where the recording made one gets the
    /// recorded address; the first other call takes the device out of step for good,
    /// and from then on addresses are the device's own (above 4 GiB, 2 MiB apart).
    #[test]
    fn the_device_answers_as_recorded_until_a_call_differs() {
        let mut d = CapacityDevice::new(None, AddressSpace::around(0, 0));
        d.in_step = true;
        let outs = [
            seg(Action::SegmentFree, 0x7000_0000, 20 * MIB),
            seg(Action::SegmentAlloc, 0x5000_0000, 20 * MIB),
        ];
        let mut f = Following {
            dev: &mut d,
            outs: &outs,
            made: 0,
        };
        // After the call released one segment, as recorded.
        assert_eq!(f.cuda_malloc(20 * MIB, 0, 1), Some(0x5000_0000));
        assert!(f.dev.in_step);
        // Before that release, the recorded entry there is a release: another call.
        let mut f = Following {
            dev: &mut d,
            outs: &outs,
            made: 0,
        };
        assert_eq!(f.cuda_malloc(20 * MIB, 0, 0), Some(4 << 30));
        assert!(!f.dev.in_step);
        // Out of step, even the recorded call gets the device's own next address.
        let mut f = Following {
            dev: &mut d,
            outs: &outs,
            made: 0,
        };
        assert_eq!(f.cuda_malloc(20 * MIB, 0, 1), Some((4 << 30) + 22 * MIB));
    }

    /// Another size than recorded is another call; the capacity refuses either way.
    #[test]
    fn a_different_size_or_no_room_is_not_the_recording() {
        let outs = [seg(Action::SegmentAlloc, 0x5000_0000, 20 * MIB)];
        let mut d = CapacityDevice::new(Some(30 * MIB), AddressSpace::around(0, 0));
        d.in_step = true;
        let mut f = Following {
            dev: &mut d,
            outs: &outs,
            made: 0,
        };
        assert_eq!(f.cuda_malloc(20 * MIB, 20 * MIB, 0), None);
        assert!(f.dev.in_step, "a refusal is no call the device answered");
        assert_eq!(f.cuda_malloc(2 * MIB, 0, 0), Some(4 << 30));
        assert!(!f.dev.in_step);
    }

    fn disjoint(taken: &[(u64, u64)]) -> bool {
        let mut v = taken.to_vec();
        v.sort_unstable();
        v.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0)
    }

    /// A recording that ends 2 MiB below 2^64: no room above, so new segments go below
    /// its lowest address, each its own range, none over the recording's.
    #[test]
    fn near_the_top_of_the_address_space_new_segments_go_below() {
        let low = u64::MAX - 320 * MIB + 1;
        let high = u64::MAX - 2 * MIB + 1;
        let mut space = AddressSpace::around(low, high);
        let taken: Vec<(u64, u64)> = (1..=20)
            .map(|k| (space.take(k * 10 * MIB), k * 10 * MIB))
            .collect();
        assert!(disjoint(&taken), "{taken:x?}");
        assert!(taken.iter().all(|&(a, s)| a + s < low && a > 0));
        assert!(!space.reused);
        // Room above while there is: the first segment of a recording 64 MiB under the
        // top goes above it, the ones that no longer fit below.
        let mut space = AddressSpace::around(1 << 40, u64::MAX - 64 * MIB);
        let first = space.take(30 * MIB);
        assert!(first > u64::MAX - 64 * MIB);
        let second = space.take(30 * MIB);
        assert!(second < 1 << 40);
        assert!(!space.reused);
    }

    /// With both ends of the space used, segments are placed from above again and the
    /// space says so; an address of its own is still given, never a panic.
    #[test]
    fn a_space_with_no_room_either_side_says_it_reused_addresses() {
        let mut space = AddressSpace::around(4 * MIB, u64::MAX - 4 * MIB);
        let a = space.take(MIB);
        let b = space.take(u64::MAX / 2);
        assert!(space.reused);
        let _ = (a, b);
        // Sizes past what the space holds saturate rather than wrap.
        let mut space = AddressSpace::around(0, 0);
        assert_eq!(space.take(u64::MAX), 4 << 30);
        assert!(space.reused);
    }
}
