//! The levels of a step read off its events as they go by: each phase's peak with the
//! components live then ([`PhasePeaks`]), and the events replayed through the allocator model
//! ([`Replayer`]). A [`super::Trace`] folds its stored events through them; an estimate feeds
//! them while the step is traced ([`super::step::levels`]) and stores no event.

use crate::caching_allocator::{CachingAllocator, Handle, Stream, round_size};
use crate::estimate::{Component, Phase, PhaseBytes};

use super::{Event, Op, Replayed};

/// More than the variants of [`Component`] and of [`Phase`]: their slots in a table.
const SLOTS: usize = 16;
const _: () =
    assert!((Component::CudaContext as usize) < SLOTS && (Phase::Decode as usize) < SLOTS);

/// A phase not seen yet.
const UNSEEN: u8 = u8::MAX;

/// Each phase's largest live total and the components live then, in the order the phases
/// first appear. An allocation is made in the phase it names; a peak is always reached at
/// an allocation (the first time, where it is reached again). Every request counts as the
/// allocator rounds it (`round_size`).
#[derive(Debug, Clone)]
pub struct PhasePeaks {
    live: [u64; SLOTS],
    total: u64,
    /// The components in the order they first appear.
    order: Vec<Component>,
    /// Each phase's peak: (phase, live total, each component's bytes then).
    peaks: Vec<(Phase, u64, [u64; SLOTS])>,
    /// Each phase's index in `peaks`.
    index: [u8; SLOTS],
}

impl Default for PhasePeaks {
    fn default() -> Self {
        Self {
            live: [0; SLOTS],
            total: 0,
            order: Vec::new(),
            peaks: Vec::new(),
            index: [UNSEEN; SLOTS],
        }
    }
}

impl PhasePeaks {
    /// Counts one event.
    pub fn on(&mut self, e: &Event) {
        let b = round_size(e.bytes);
        let c = e.component as usize;
        if e.op == Op::Free {
            self.live[c] -= b;
            self.total -= b;
            return;
        }
        if self.live[c] == 0 && !self.order.contains(&e.component) {
            self.order.push(e.component);
        }
        self.live[c] += b;
        self.total += b;
        let p = e.phase as usize;
        if self.index[p] == UNSEEN {
            self.index[p] = u8::try_from(self.peaks.len()).unwrap_or(UNSEEN);
            self.peaks.push((e.phase, 0, [0; SLOTS]));
        }
        let peak = &mut self.peaks[usize::from(self.index[p])];
        if self.total > peak.1 {
            peak.1 = self.total;
            peak.2 = self.live;
        }
    }

    /// The phases with their components, in the order they first appeared.
    #[must_use]
    pub fn finish(self) -> Vec<PhaseBytes> {
        self.peaks
            .into_iter()
            .map(|(phase, _, live)| PhaseBytes {
                phase,
                components: self
                    .order
                    .iter()
                    .map(|&c| (c, live[c as usize]))
                    .filter(|c| c.1 > 0)
                    .collect(),
            })
            .collect()
    }
}

/// Events replayed through [`CachingAllocator`] as they go by.
#[derive(Debug, Clone, Default)]
pub struct Replayer {
    allocator: CachingAllocator,
    /// Each live tensor's block, by tensor number.
    handles: Vec<Option<Handle>>,
}

impl Replayer {
    /// A replayer with room for `tensors` tensors.
    #[must_use]
    pub fn with_capacity(tensors: usize) -> Self {
        Self {
            allocator: CachingAllocator::new(),
            handles: Vec::with_capacity(tensors),
        }
    }

    /// Replays one event.
    pub fn on(&mut self, e: &Event) {
        let i = e.tensor as usize;
        match e.op {
            Op::Alloc => {
                if self.handles.len() <= i {
                    self.handles.resize(i + 1, None);
                }
                self.handles[i] = Some(self.allocator.malloc_on(Stream(e.stream), e.bytes));
            }
            Op::Free => {
                if let Some(h) = self.handles.get_mut(i).and_then(Option::take) {
                    self.allocator.free(h);
                }
            }
        }
    }

    /// The peaks so far.
    #[must_use]
    pub const fn peaks(&self) -> Replayed {
        Replayed {
            allocated: self.allocator.peak_allocated(),
            reserved: self.allocator.peak_reserved(),
        }
    }
}
