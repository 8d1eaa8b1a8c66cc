//! Work on a list's items in parallel, read the results in the list's order.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Condvar, Mutex, PoisonError};

/// How far past the item being read the workers may go, in items per worker.
const AHEAD_PER_WORKER: usize = 32;

/// What the fold of [`visit_in_order`] is handed, in order: whether to go on to item `i`,
/// then, if it does, the item's result.
pub(super) enum Turn<R> {
    /// Item `i` is next: break to stop before it.
    Next(usize),
    /// The result of the item just announced.
    Done(R),
}

/// Computes `work(i)` for `i` in `0..n` on `workers` threads and hands the results to `fold`
/// in index order, each announced first ([`Turn::Next`]), stopping at the first turn `fold`
/// breaks.
///
/// `fold` sees the same sequence whatever the number of workers, so what it builds does not
/// depend on it. The workers run at most [`AHEAD_PER_WORKER`] items each past the one `fold`
/// waits for; once it breaks no item is started (the ones already started are finished and
/// dropped). With one worker (or one item) nothing runs ahead: `work(i)` is called only for
/// the items `fold` goes on to.
pub(super) fn visit_in_order<R: Send>(
    n: usize,
    workers: usize,
    work: impl Fn(usize) -> R + Sync,
    mut fold: impl FnMut(Turn<R>) -> ControlFlow<()> + Send,
) {
    if workers <= 1 || n <= 1 {
        for i in 0..n {
            if fold(Turn::Next(i)).is_break() || fold(Turn::Done(work(i))).is_break() {
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

impl<R, F: FnMut(Turn<R>) -> ControlFlow<()>> Visit<'_, R, F> {
    /// Folds the results whose turn has come, in order.
    fn fold_ready(&mut self) {
        while !self.stopped
            && let Some(r) = self.early.remove(&self.turn)
        {
            self.stopped = (self.fold)(Turn::Next(self.turn)).is_break()
                || (self.fold)(Turn::Done(r)).is_break();
            self.turn += 1;
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
                |t| match t {
                    Turn::Next(i) if i > 30 => ControlFlow::Break(()),
                    Turn::Next(_) => ControlFlow::Continue(()),
                    Turn::Done(r) => {
                        seen.push(r);
                        ControlFlow::Continue(())
                    }
                },
            );
            let expected: Vec<usize> = (0..=30).map(|i| i * i).collect();
            assert_eq!(seen, expected, "{workers} workers");
        }
    }

    /// Without a break every item is folded once; with one worker no item past a break is
    /// worked on.
    #[test]
    fn folds_every_item_without_a_break() {
        let mut sum = 0;
        visit_in_order(
            1000,
            4,
            |i| i,
            |t| {
                if let Turn::Done(r) = t {
                    sum += r;
                }
                ControlFlow::Continue(())
            },
        );
        assert_eq!(sum, 999 * 1000 / 2);
        let worked = std::sync::atomic::AtomicUsize::new(0);
        visit_in_order(
            100,
            1,
            |_| worked.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            |t| match t {
                Turn::Next(10) => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            },
        );
        assert_eq!(worked.into_inner(), 10);
    }
}
