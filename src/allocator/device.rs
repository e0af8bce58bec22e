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

/// A device with `capacity` bytes for the allocator (None: unlimited) and a bump
/// allocator of addresses starting at `next`.
#[derive(Clone, Debug)]
pub struct CapacityDevice {
    pub capacity: Option<u64>,
    next: u64,
    /// The most the allocator asked to hold (reserved + the new memory) since reset.
    pub max_need: u64,
    /// Whether every call to the device so far was the recording's, so that the device
    /// answers as the recording shows ([`Following`]).
    pub in_step: bool,
}

impl CapacityDevice {
    /// New segments start above `above` (the highest address the state uses).
    pub fn new(capacity: Option<u64>, above: u64) -> CapacityDevice {
        CapacityDevice {
            capacity,
            max_need: 0,
            in_step: false,
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
        let mut d = CapacityDevice::new(None, 0);
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
        let mut d = CapacityDevice::new(Some(30 * MIB), 0);
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
}
