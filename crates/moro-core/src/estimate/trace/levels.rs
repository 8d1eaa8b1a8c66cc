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
    /// Requests are rounded as the MPS allocator rounds them, else as CUDA's.
    mps: bool,
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
            mps: backend == Backend::Mps,
        }
    }

    /// Counts one event.
    pub fn on(&mut self, e: &Event) {
        let b = if self.mps {
            crate::mps_allocator::round_size(e.bytes)
        } else {
            crate::caching_allocator::round_size(e.bytes)
        };
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

/// An allocator model a step replays through: CUDA's caching allocator, or PyTorch's MPS
/// heaps.
pub trait AllocatorModel: Default {
    /// What an allocation returns and its free takes.
    type Handle: Copy;
    /// Allocates `bytes` on `stream`.
    fn alloc(&mut self, stream: Stream, bytes: u64) -> Self::Handle;
    /// Frees an allocation.
    fn release(&mut self, h: Self::Handle);
    /// The peaks so far.
    fn peaks(&self) -> Replayed;
}

impl AllocatorModel for CachingAllocator {
    type Handle = Handle;
    fn alloc(&mut self, stream: Stream, bytes: u64) -> Handle {
        self.malloc_on(stream, bytes)
    }
    fn release(&mut self, h: Handle) {
        self.free(h);
    }
    fn peaks(&self) -> Replayed {
        Replayed {
            allocated: self.peak_allocated(),
            reserved: self.peak_reserved(),
            needed: self.peak_needed(),
        }
    }
}

/// MPS has one stream: the event's is not read.
impl AllocatorModel for MpsAllocator {
    type Handle = MpsHandle;
    fn alloc(&mut self, _: Stream, bytes: u64) -> MpsHandle {
        self.malloc(bytes)
    }
    fn release(&mut self, h: MpsHandle) {
        self.free(h);
    }
    fn peaks(&self) -> Replayed {
        // No release of idle heaps is modelled: every reserved byte counts as needed.
        Replayed {
            allocated: self.peak_allocated(),
            reserved: self.peak_reserved(),
            needed: self.peak_reserved(),
        }
    }
}

/// Events replayed through an allocator model as they go by.
#[derive(Debug, Clone, Default)]
pub struct Replayer<A: AllocatorModel = CachingAllocator> {
    allocator: A,
    /// Each live tensor's block, by tensor number.
    handles: Vec<Option<A::Handle>>,
}

impl<A: AllocatorModel> Replayer<A> {
    /// A replayer with room for `tensors` tensors.
    #[must_use]
    pub fn with_capacity(tensors: usize) -> Self {
        Self {
            allocator: A::default(),
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
                self.handles[i] = Some(self.allocator.alloc(Stream(e.stream), e.bytes));
            }
            Op::Free => {
                if let Some(h) = self.handles.get_mut(i).and_then(Option::take) {
                    self.allocator.release(h);
                }
            }
        }
    }

    /// The peaks so far.
    #[must_use]
    pub fn peaks(&self) -> Replayed {
        self.allocator.peaks()
    }
}

/// A replay through the job's backend's allocator ([`Backend`]).
#[derive(Debug, Clone)]
pub enum BackendReplayer {
    /// CUDA's caching allocator.
    Cuda(Replayer<CachingAllocator>),
    /// PyTorch's MPS heaps.
    Mps(Replayer<MpsAllocator>),
}

impl BackendReplayer {
    /// A replayer through `backend`'s allocator with room for `tensors` tensors.
    #[must_use]
    pub fn with_capacity(backend: Backend, tensors: usize) -> Self {
        match backend {
            Backend::Cuda => Self::Cuda(Replayer::with_capacity(tensors)),
            Backend::Mps => Self::Mps(Replayer::with_capacity(tensors)),
        }
    }

    /// Replays one event.
    #[inline]
    pub fn on(&mut self, e: &Event) {
        match self {
            Self::Cuda(r) => r.on(e),
            Self::Mps(r) => r.on(e),
        }
    }

    /// The peaks so far.
    #[must_use]
    pub fn peaks(&self) -> Replayed {
        match self {
            Self::Cuda(r) => r.peaks(),
            Self::Mps(r) => r.peaks(),
        }
    }
}
