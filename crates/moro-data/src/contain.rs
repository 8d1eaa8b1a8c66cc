//! Running library code that panics on malformed input (parquet 60 asserts on some metadata,
//! tokenizers 0.22 unwraps inside some deserializers) so that the panic is an error of ours:
//! caught, and with the panic hook silenced meanwhile so nothing is printed. The swap of the
//! process-wide hook is serialised, so concurrent callers restore the hook they found.

use std::panic::{AssertUnwindSafe, catch_unwind, set_hook, take_hook};
use std::sync::{Mutex, PoisonError};

static HOOK: Mutex<()> = Mutex::new(());

/// `f()`, or `None` when it panicked.
pub(crate) fn contained<T>(f: impl FnOnce() -> T) -> Option<T> {
    let _guard = HOOK.lock().unwrap_or_else(PoisonError::into_inner);
    let hook = take_hook();
    set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    set_hook(hook);
    result.ok()
}
