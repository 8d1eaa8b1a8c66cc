//! The last few answers of a slow route (`fit` searches every GPU class), keyed by the
//! request's settings: the page asks `/api/fit` and `/api/fit.svg` for the same job in turn.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// A most-recently-used list of at most `capacity` answers.
#[derive(Debug)]
pub(crate) struct Recent<V> {
    capacity: usize,
    entries: Mutex<VecDeque<(String, V)>>,
}

impl<V: Clone> Recent<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// The answer for `key`, made by `make` when it is not kept (outside the lock: two
    /// requests for the same new key both make it).
    pub(crate) fn get_or<E>(
        &self,
        key: String,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        if let Ok(mut e) = self.entries.lock()
            && let Some(i) = e.iter().position(|(k, _)| *k == key)
        {
            let hit = e.remove(i).expect("a position in the list");
            let v = hit.1.clone();
            e.push_front(hit);
            return Ok(v);
        }
        let v = make()?;
        if let Ok(mut e) = self.entries.lock() {
            e.retain(|(k, _)| *k != key);
            e.push_front((key, v.clone()));
            e.truncate(self.capacity);
        }
        Ok(v)
    }
}

/// The settings of a request body in one order (field names sorted), as a key.
pub(crate) fn key_of(body: &Value) -> String {
    match body.as_object() {
        Some(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            serde_json::to_string(&sorted).unwrap_or_default()
        }
        None => body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_and_makes_the_rest() {
        let r = Recent::new(2);
        let mut made = 0;
        let mut get = |k: &str| {
            r.get_or::<()>(k.to_owned(), || {
                made += 1;
                Ok(k.len())
            })
            .unwrap()
        };
        assert_eq!(get("a"), 1);
        assert_eq!(get("bb"), 2);
        assert_eq!(get("a"), 1); // kept
        assert_eq!(get("ccc"), 3); // evicts "bb", the least recent
        assert_eq!(get("a"), 1);
        assert_eq!(get("bb"), 2); // made again
        assert_eq!(made, 4);
        assert!(r.get_or::<&str>("x".into(), || Err("no")).is_err());
    }

    #[test]
    fn keys_do_not_depend_on_field_order() {
        let a: Value = serde_json::from_str(r#"{"model": "m", "seq_len": 1}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"seq_len": 1, "model": "m"}"#).unwrap();
        assert_eq!(key_of(&a), key_of(&b));
    }
}
