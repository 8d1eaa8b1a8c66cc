//! [`Value`]: the ordered document tree every exporter builds, written by [`crate::yaml`],
//! [`crate::json`] and [`crate::python`].

/// A configuration value. Maps keep their insertion order (the order the file is written in).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null` / `None`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A finite float (always written with a dot, so every reader sees a float).
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<Value>),
    /// An ordered mapping.
    Map(Map),
}

/// An ordered string-keyed mapping.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Map(pub Vec<(String, Value)>);

impl Map {
    /// An empty map.
    #[must_use]
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    /// Appends `key: value` (replacing an earlier value of `key` in place).
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        let value = value.into();
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            self.0.push((key.to_owned(), value));
        }
    }

    /// Appends `key: value` when `value` is `Some`.
    pub fn set_opt<V: Into<Value>>(&mut self, key: &str, value: Option<V>) {
        if let Some(v) = value {
            self.set(key, v);
        }
    }

    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether the map is empty.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Value {
    /// Dotted paths of every mapping key in the tree: `a`, `a.b`, and `a[].c` for mappings
    /// inside a list under `a`.
    #[must_use]
    pub fn key_paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(self, "", &mut out);
        out
    }

    /// The value at a dotted path of mapping keys (no list indices).
    #[must_use]
    pub fn at(&self, path: &str) -> Option<&Self> {
        path.split('.').try_fold(self, |v, k| match v {
            Self::Map(m) => m.get(k),
            _ => None,
        })
    }
}

fn walk(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Map(m) => {
            for (k, v) in &m.0 {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(path.clone());
                walk(v, &path, out);
            }
        }
        Value::List(items) => {
            for item in items {
                walk(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Self::Str(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Self::Str(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Self::Str(v.clone())
    }
}

impl From<Map> for Value {
    fn from(v: Map) -> Self {
        Self::Map(v)
    }
}

impl<T: Into<Self>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Self::List(v.into_iter().map(Into::into).collect())
    }
}

/// A float as every reader of YAML 1.1, JSON and Python reads it back: the shortest decimal
/// that round-trips, always with a dot, never in exponent form (PyYAML reads `1e-05` as a
/// string). Non-finite values are written as `0.0`; exporters reject them first.
#[must_use]
pub fn float_text(v: f64) -> String {
    if !v.is_finite() {
        return "0.0".to_owned();
    }
    let mut s = format!("{v}");
    if !s.contains('.') {
        s.push_str(".0");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_always_have_a_dot_and_no_exponent() {
        assert_eq!(float_text(2e-4), "0.0002");
        assert_eq!(float_text(1e-5), "0.00001");
        assert_eq!(float_text(3.0), "3.0");
        assert_eq!(float_text(0.05), "0.05");
        assert_eq!(float_text(-1.5), "-1.5");
    }

    #[test]
    fn key_paths_walk_maps_and_lists() {
        let mut inner = Map::new();
        inner.set("path", "x");
        let mut m = Map::new();
        m.set("a", 1_u64);
        m.set("datasets", Value::List(vec![Value::Map(inner)]));
        assert_eq!(
            Value::Map(m).key_paths(),
            ["a", "datasets", "datasets[].path"]
        );
    }
}
