//! The supported `model_type` closest to an unsupported one, for the error's hint.

/// The supported type nearest `model_type` by edit distance (ties: the longer shared prefix,
/// then the list's order), when it is near enough to be a useful hint: within half the
/// name's length, or sharing a prefix of at least four characters (`llama4` → `llama`,
/// `qwen3_next` → `qwen3_moe`).
#[must_use]
pub fn closest_supported<'a>(model_type: &str, supported: &[&'a str]) -> Option<&'a str> {
    let lowered = model_type.to_ascii_lowercase();
    let best = supported
        .iter()
        .map(|s| {
            let prefix = shared_prefix(&lowered, s);
            (
                crate::catalog::levenshtein(&lowered, s),
                std::cmp::Reverse(prefix),
                *s,
            )
        })
        .min_by_key(|&(d, p, _)| (d, p))?;
    let (distance, std::cmp::Reverse(prefix), name) = best;
    let near = distance * 2 <= lowered.chars().count() || prefix >= 4;
    // A prefix-sharing type further away can still be the better hint.
    let by_prefix = supported
        .iter()
        .map(|s| (shared_prefix(&lowered, s), std::cmp::Reverse(s.len()), *s))
        .max_by_key(|&(p, l, _)| (p, l))
        .filter(|&(p, _, _)| p >= 4 && p > prefix)
        .map(|(_, _, s)| s);
    by_prefix.or(near.then_some(name))
}

fn shared_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: &[&str] = &[
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma3",
        "phi3",
    ];

    #[test]
    fn near_names_are_suggested() {
        assert_eq!(closest_supported("llama4", TYPES), Some("llama"));
        assert_eq!(closest_supported("mistral3", TYPES), Some("mistral"));
        assert_eq!(closest_supported("qwen3_next", TYPES), Some("qwen3_moe"));
        assert_eq!(closest_supported("Gemma3n", TYPES), Some("gemma3"));
        assert_eq!(closest_supported("phimoe", TYPES), Some("phi3"));
    }

    #[test]
    fn far_names_are_not() {
        assert_eq!(closest_supported("t5", TYPES), None);
        assert_eq!(closest_supported("mamba", TYPES), None);
    }
}
