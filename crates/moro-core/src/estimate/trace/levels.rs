//! The levels of a step read off its events as they go by: each phase's peak with the
//! components live then ([`PhasePeaks`]), and the events replayed through the allocator model
//! ([`Replayer`]). A [`super::Trace`] folds its stored events through them; an estimate feeds
//! them while the step is traced ([`super::step::levels`]) and stores no event. Both follow
//! the job's backend ([`Backend`]): CUDA's caching allocator, or PyTorch's MPS heaps.

use crate::caching_allocator::{CachingAllocator, Handle, Stream};
use crate::estimate::{Backend, Component, Phase, PhaseBytes};
use crate::mps_allocator::{MpsAllocator, MpsHandle};

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
/// backend's allocator rounds it (`round_size`).
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
    /// The bytes a request occupies.
    round: fn(u64) -> u64,
}

impl Default for PhasePeaks {
    fn default() -> Self {
        Self::on_backend(Backend::Cuda)
    }
}

impl PhasePeaks {
    /// No event yet; requests rounded as `backend`'s allocator rounds them.
    #[must_use]
    pub fn on_backend(backend: Backend) -> Self {
        Self {
            live: [0; SLOTS],
            total: 0,
            order: Vec::new(),
            peaks: Vec::new(),
            index: [UNSEEN; SLOTS],
            round: match backend {
                Backend::Cuda => crate::caching_allocator::round_size,
                Backend::Mps => crate::mps_allocator::round_size,
            },
        }
    }

    /// Counts one event.
    pub fn on(&mut self, e: &Event) {
        let b = (self.round)(e.bytes);
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

/// Events replayed through the backend's allocator model as they go by.
#[derive(Debug, Clone)]
pub struct Replayer {
    allocator: Model,
    /// Each live tensor's block, by tensor number.
    handles: Vec<Option<Block>>,
}

/// The allocator a backend replays through.
#[derive(Debug, Clone)]
enum Model {
    Cuda(CachingAllocator),
    Mps(MpsAllocator),
}

#[derive(Debug, Clone, Copy)]
enum Block {
    Cuda(Handle),
    Mps(MpsHandle),
}

impl Default for Replayer {
    fn default() -> Self {
        Self::with_capacity(Backend::Cuda, 0)
    }
}

impl Replayer {
    /// A replayer through `backend`'s allocator with room for `tensors` tensors.
    #[must_use]
    pub fn with_capacity(backend: Backend, tensors: usize) -> Self {
        Self {
            allocator: match backend {
                Backend::Cuda => Model::Cuda(CachingAllocator::new()),
                Backend::Mps => Model::Mps(MpsAllocator::new()),
            },
            handles: Vec::with_capacity(tensors),
        }
    }

    /// Replays one event (MPS has one stream: the event's is not read there).
    pub fn on(&mut self, e: &Event) {
        let i = e.tensor as usize;
        match e.op {
            Op::Alloc => {
                if self.handles.len() <= i {
                    self.handles.resize(i + 1, None);
                }
                self.handles[i] = Some(match &mut self.allocator {
                    Model::Cuda(a) => Block::Cuda(a.malloc_on(Stream(e.stream), e.bytes)),
                    Model::Mps(a) => Block::Mps(a.malloc(e.bytes)),
                });
            }
            Op::Free => match (
                &mut self.allocator,
                self.handles.get_mut(i).and_then(Option::take),
            ) {
                (Model::Cuda(a), Some(Block::Cuda(h))) => a.free(h),
                (Model::Mps(a), Some(Block::Mps(h))) => a.free(h),
                _ => {}
            },
        }
    }

    /// The peaks so far.
    #[must_use]
    pub const fn peaks(&self) -> Replayed {
        match &self.allocator {
            Model::Cuda(a) => Replayed {
                allocated: a.peak_allocated(),
                reserved: a.peak_reserved(),
            },
            Model::Mps(a) => Replayed {
                allocated: a.peak_allocated(),
                reserved: a.peak_reserved(),
            },
        }
    }
}
