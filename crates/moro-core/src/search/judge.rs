//! Judging configurations against a device: [`evaluate`] in full, probes that keep only what
//! judging needs, and the [`EstimateCache`] searches of one model share.

use crate::estimate::replay::ReplayedStep;
use crate::estimate::{
    DeviceProfile, Estimate, add_replayed_step, estimate_without_replay, replayed_step,
};
use crate::job::{Job, JobError};
use crate::model::ModelSpec;

use super::*;

/// Estimates one configuration, its replayed steps included.
///
/// # Errors
/// The job is invalid for the model (e.g. a rank above the hidden size).
pub fn evaluate(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    config: Config,
) -> Result<Candidate, JobError> {
    evaluate_cached(model, space, caps, config, None)
}

/// [`evaluate`], the replayed fragmentation shared through `cache`.
pub(super) fn evaluate_cached(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    config: Config,
    cache: Option<&EstimateCache>,
) -> Result<Candidate, JobError> {
    let job = space.job(&config);
    let mut estimate = estimate_without_replay(model, &job, &caps.profile)?;
    let step = replayed(&estimate, model, &job, caps, config, cache);
    add_replayed_step(&mut estimate, &caps.profile, step.as_ref());
    let room = Room::of(&Judged::of(&estimate, &job), caps);
    Ok(Candidate {
        config,
        job,
        estimate,
        margin_bytes: room.margin,
        headroom_bytes: room.headroom,
        host_fits: room.host_fits,
    })
}

/// The step trace of `config` read for the estimate ([`replayed_step`]), from `cache` when
/// a device with the same cuBLAS workspace traced it before.
fn replayed(
    est: &Estimate,
    model: &ModelSpec,
    job: &Job,
    caps: &Caps,
    config: Config,
    cache: Option<&EstimateCache>,
) -> Option<ReplayedStep> {
    let replay = || replayed_step(est, model, job, &caps.profile);
    match cache {
        Some(c) => c.step(config, TraceDevice::of(&caps.profile), replay),
        None => replay(),
    }
}

/// What judging an estimate against a device needs of it.
#[derive(Debug, Clone, Copy)]
struct Judged {
    peak_device_bytes: u64,
    margin: u64,
    host_bytes_per_node: u64,
}

impl Judged {
    /// [`Self::of`] an estimate before its step is replayed. Where the replay alone sets the
    /// reserve (layers traced op by op, or MPS), which can be far under the formulas' ratio
    /// and floor: judged without a reserve, that estimate is never over the replayed one, so
    /// a configuration that does not fit then cannot fit at all.
    fn before_replay(est: &Estimate, model: &ModelSpec, job: &Job, device: &DeviceProfile) -> Self {
        if !crate::estimate::replay::replay_sets_reserve(model, job, &est.regime, device) {
            return Self::of(est, job);
        }
        let reserve = est.component(crate::estimate::Component::AllocatorReserve);
        let mut low = est.clone();
        low.peak_reserved_bytes = low.peak_reserved_bytes.saturating_sub(reserve);
        low.peak_device_bytes = low.peak_device_bytes.saturating_sub(reserve);
        for c in &mut low.components {
            if c.0 == crate::estimate::Component::AllocatorReserve {
                c.1 = 0;
            }
        }
        Self::of(&low, job)
    }

    fn of(est: &Estimate, job: &Job) -> Self {
        Self {
            peak_device_bytes: est.peak_device_bytes,
            margin: margin_bytes(est, job),
            // The job carries its layout's node count: a node's host RAM holds its ranks'
            // states.
            host_bytes_per_node: est.host_bytes_per_node(job.parallel.gpus_per_node()),
        }
    }
}

/// Estimates kept across the searches of one model and one request on several devices
/// and GPU counts (`moro fit`): an estimate depends on the configuration and the device
/// profile, not on the memory it is judged against, and those searches visit many of the
/// same configurations. Only what judging needs is kept (a few words per configuration).
/// Sharing one cache between searches of different models or requests is a mistake: the
/// key does not name them.
#[derive(Debug, Default)]
pub struct EstimateCache {
    inner: std::sync::Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    /// The distinct device profiles seen, indexed by the keys.
    profiles: Vec<DeviceProfile>,
    entries: std::collections::HashMap<(Config, usize), Cached>,
    /// The step trace of a configuration as the estimate reads it, by the parts of the
    /// device the trace reads: shared by the devices of one architecture.
    steps: std::collections::HashMap<(Config, TraceDevice), Option<ReplayedStep>>,
}

/// What the step trace reads of a device: its cuBLAS workspace, whether SDPA has its flash
/// kernel (without it grouped KV heads run the math kernel), and the backend (its allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TraceDevice(u64, bool, crate::estimate::Backend);

impl TraceDevice {
    const fn of(d: &DeviceProfile) -> Self {
        Self(d.cublas_workspace_bytes, d.flash_sdpa, d.backend)
    }
}

/// One configuration judged before the replayed steps (`None`: not a valid job), and with
/// them once that was needed.
#[derive(Debug, Clone, Copy)]
struct Cached {
    base: Option<Judged>,
    replayed: Option<Judged>,
}

impl EstimateCache {
    fn key(inner: &mut CacheInner, config: Config, profile: &DeviceProfile) -> (Config, usize) {
        let i = inner
            .profiles
            .iter()
            .position(|p| p == profile)
            .unwrap_or_else(|| {
                inner.profiles.push(profile.clone());
                inner.profiles.len() - 1
            });
        (config, i)
    }

    fn get(&self, config: Config, profile: &DeviceProfile) -> Option<Cached> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(&mut inner, config, profile);
        inner.entries.get(&key).copied()
    }

    /// The step trace of `config` on `device` as the estimate reads it, computed by
    /// `replay` the first time.
    fn step(
        &self,
        config: Config,
        device: TraceDevice,
        replay: impl FnOnce() -> Option<ReplayedStep>,
    ) -> Option<ReplayedStep> {
        let key = (config, device);
        let lock = || {
            self.inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(s) = lock().steps.get(&key) {
            return s.clone();
        }
        let s = replay();
        lock().steps.insert(key, s.clone());
        s
    }

    fn put(&self, config: Config, profile: &DeviceProfile, cached: Cached) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(&mut inner, config, profile);
        inner.entries.insert(key, cached);
    }
}

/// A configuration judged against the device, its estimate not kept.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    pub(super) config: Config,
    pub(super) headroom: i64,
    pub(super) host_fits: bool,
}

impl Probe {
    pub(super) const fn fits(&self) -> bool {
        self.headroom >= 0 && self.host_fits
    }
}

/// Judges one configuration: on [`estimate_without_replay`], and with the step trace only
/// when that fits (the trace's device level is at most 1.4 % under the formulas' on every
/// validation row, mostly above, and the search probes many that do not fit). `None`: not
/// a valid job.
pub(super) fn probe(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    config: Config,
    cache: Option<&EstimateCache>,
) -> Option<Probe> {
    let cached = cache.and_then(|c| c.get(config, &caps.profile));
    let mut job = None;
    let mut base_estimate = None;
    let mut entry = cached.unwrap_or_else(|| {
        let j = space.job(&config);
        let est = estimate_without_replay(model, &j, &caps.profile).ok();
        let base = est
            .as_ref()
            .map(|e| Judged::before_replay(e, model, &j, &caps.profile));
        job = Some(j);
        base_estimate = est;
        Cached {
            base,
            replayed: None,
        }
    });
    let mut room = Room::of(&entry.base?, caps);
    if room.fits() {
        let replayed = match entry.replayed {
            Some(r) => r,
            None => {
                let j = job.unwrap_or_else(|| space.job(&config));
                let mut est = match base_estimate {
                    Some(e) => e,
                    None => estimate_without_replay(model, &j, &caps.profile).ok()?,
                };
                let step = replayed(&est, model, &j, caps, config, cache);
                add_replayed_step(&mut est, &caps.profile, step.as_ref());
                let r = Judged::of(&est, &j);
                entry.replayed = Some(r);
                r
            }
        };
        room = Room::of(&replayed, caps);
    }
    if let Some(c) = cache
        && cached.is_none_or(|c| c.replayed.is_none() && entry.replayed.is_some())
    {
        c.put(config, &caps.profile, entry);
    }
    Some(Probe {
        config,
        headroom: room.headroom,
        host_fits: room.host_fits,
    })
}

/// An estimate against the capacity: its safety margin, the headroom left after it, and
/// whether the host memory holds what it offloads.
struct Room {
    margin: u64,
    headroom: i64,
    host_fits: bool,
}

impl Room {
    fn of(j: &Judged, caps: &Caps) -> Self {
        let need = j.peak_device_bytes.saturating_add(j.margin);
        let headroom = i128::from(caps.usable_bytes) - i128::from(need);
        let headroom =
            i64::try_from(headroom).unwrap_or(if headroom < 0 { i64::MIN } else { i64::MAX });
        Self {
            margin: j.margin,
            headroom,
            host_fits: caps.host_bytes.is_none_or(|h| j.host_bytes_per_node <= h),
        }
    }

    const fn fits(&self) -> bool {
        self.headroom >= 0 && self.host_fits
    }
}
