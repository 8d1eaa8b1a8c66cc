//! Work on a list's items in parallel, read the results in the list's order.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Condvar, Mutex, PoisonError};

/// How far past the item being read the workers may go, in items per worker.
const AHEAD_PER_WORKER: usize = 32;

/// Computes `work(i)` for `i` in `0..n` on `workers` threads and hands the results to `fold`
/// in index order, stopping at the first `fold` that breaks.
///
/// `fold` sees the same sequence whatever the number of workers, so what it builds does not
/// depend on it. The workers run at most [`AHEAD_PER_WORKER`] items each past the one `fold`
/// waits for; once it breaks no item is started (the ones already started are finished and
/// dropped). With one worker (or one item) nothing runs ahead: `work(i)` is called only for
/// the items `fold` reads.
pub(super) fn visit_in_order<R: Send>(
    n: usize,
    workers: usize,
    work: impl Fn(usize) -> R + Sync,
    mut fold: impl FnMut(R) -> ControlFlow<()> + Send,
) {
    if workers <= 1 || n <= 1 {
        for i in 0..n {
            if fold(work(i)).is_break() {
                return;
            }
        }
        return;
    }
    let window = workers * AHEAD_PER_WORKER;
    let shared = Mutex::new(Visit {
        next: 0,
        turn: 0,
        early: BTreeMap::new(),
        stopped: false,
        fold: &mut fold,
    });
    let moved = Condvar::new();
    let worker = || {
        let lock = || shared.lock().unwrap_or_else(PoisonError::into_inner);
        let mut v = lock();
        loop {
            if v.stopped || v.next >= n {
                return;
            }
            if v.next >= v.turn + window {
                v = moved.wait(v).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let i = v.next;
            v.next += 1;
            drop(v);
            let r = work(i);
            v = lock();
            v.early.insert(i, r);
            let before = v.turn;
            v.fold_ready();
            if v.turn != before || v.stopped {
                moved.notify_all();
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..workers.min(n) {
            s.spawn(worker);
        }
        worker();
    });
}

/// The visit's state, shared by the workers under one lock.
struct Visit<'f, R, F> {
    /// The next item to start.
    next: usize,
    /// The next item to fold.
    turn: usize,
    /// Results finished before their turn, by index.
    early: BTreeMap<usize, R>,
    /// Whether the fold broke.
    stopped: bool,
    fold: &'f mut F,
}

impl<R, F: FnMut(R) -> ControlFlow<()>> Visit<'_, R, F> {
    /// Folds the results whose turn has come, in order.
    fn fold_ready(&mut self) {
        while !self.stopped
            && let Some(r) = self.early.remove(&self.turn)
        {
            self.turn += 1;
            self.stopped = (self.fold)(r).is_break();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fold reads the items in order and stops where it breaks, with any number of
    /// workers, even when later items finish first.
    #[test]
    fn folds_in_order_and_stops_at_the_break() {
        for workers in [1, 2, 3, 8] {
            let mut seen = Vec::new();
            visit_in_order(
                50,
                workers,
                |i| {
                    // Early items take longest, so later ones arrive first.
                    std::thread::sleep(std::time::Duration::from_micros(((50 - i) * 20) as u64));
                    i * i
                },
                |r| {
                    seen.push(r);
                    if r >= 30 * 30 {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            );
            let expected: Vec<usize> = (0..=30).map(|i| i * i).collect();
            assert_eq!(seen, expected, "{workers} workers");
        }
    }

    /// Without a break every item is folded once.
    #[test]
    fn folds_every_item_without_a_break() {
        let mut sum = 0;
        visit_in_order(
            1000,
            4,
            |i| i,
            |r| {
                sum += r;
                ControlFlow::Continue(())
            },
        );
        assert_eq!(sum, 999 * 1000 / 2);
    }
}
