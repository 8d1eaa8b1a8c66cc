//! LoRA target names across naming schemes.
//!
//! PEFT matches `target_modules` against module names by suffix, so the names depend on the
//! architecture (`q_proj`, fused `qkv_proj` / `query_key_value` / `c_attn`, `dense`, ...).
//! litgpt names its targets by role (`query`, `key`, `value`, `projection`, `mlp`, `head`)
//! and torchtune uses `output_proj`. [`resolve`] maps a requested list onto the Linears the
//! model really has, so the same recipe means the same adapters on every model.

use crate::job::Targets;
use crate::model::{LinearRole, ModelSpec, WeightLayout};

/// Roles a module name can stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Q,
    K,
    V,
    O,
    MlpIn,
    MlpOut,
}

fn roles_of_request(name: &str) -> &'static [Role] {
    match name {
        "query" | "q" | "wq" | "q_proj" => &[Role::Q],
        "key" | "k" | "wk" | "k_proj" => &[Role::K],
        "value" | "v" | "wv" | "v_proj" => &[Role::V],
        "qkv_proj" | "query_key_value" | "c_attn" | "wqkv" | "w_pack" | "attn" => {
            &[Role::Q, Role::K, Role::V]
        }
        "projection" | "o" | "wo" | "o_proj" | "output_proj" | "out_proj" | "dense" => &[Role::O],
        "mlp" | "ffn" | "feed_forward" => &[Role::MlpIn, Role::MlpOut],
        "gate_proj" | "up_proj" | "gate_up_proj" | "w1" | "w3" | "fc1" | "c_fc"
        | "dense_h_to_4h" | "fc_in" => &[Role::MlpIn],
        "down_proj" | "w2" | "fc2" | "dense_4h_to_h" | "fc_out" => &[Role::MlpOut],
        _ => &[],
    }
}

fn roles_of_linear(name: &str, role: LinearRole, out: u64, h: u64) -> &'static [Role] {
    match role {
        LinearRole::Router => &[],
        LinearRole::Vision => match name {
            "q_proj" => &[Role::Q],
            "k_proj" => &[Role::K],
            "v_proj" => &[Role::V],
            "qkv" => &[Role::Q, Role::K, Role::V],
            "out_proj" | "proj" => &[Role::O],
            "fc1" | "gate_proj" | "up_proj" => &[Role::MlpIn],
            "fc2" | "down_proj" => &[Role::MlpOut],
            _ => &[],
        },
        LinearRole::Attention => match name {
            "q_proj" | "q_a_proj" | "q_b_proj" | "query" | "q" => &[Role::Q],
            "k_proj" | "key" | "k" => &[Role::K],
            "v_proj" | "value" | "v" => &[Role::V],
            "o" => &[Role::O],
            "kv_a_proj_with_mqa" | "kv_b_proj" => &[Role::K, Role::V],
            "o_proj" | "dense" | "out_proj" | "wo" | "c_proj" => &[Role::O],
            _ if out == h => &[Role::O],
            _ => &[Role::Q, Role::K, Role::V],
        },
        LinearRole::Mlp | LinearRole::Expert | LinearRole::SharedExpert => match name {
            "down_proj" | "w2" | "fc2" | "dense_4h_to_h" | "c_proj" | "fc_out" => &[Role::MlpOut],
            _ if out == h => &[Role::MlpOut],
            _ => &[Role::MlpIn],
        },
    }
}

/// Whether a requested target name is the output layer (`lm_head`, litgpt's `head`,
/// torchtune's `output`), which [`resolve`] drops.
fn is_output_layer(name: &str) -> bool {
    let name = name.split('(').next().unwrap_or(name).trim();
    matches!(
        name.to_ascii_lowercase().as_str(),
        "head" | "lm_head" | "output"
    )
}

/// The requested target names that [`resolve`] leaves out because they name the output
/// layer: a caller says so rather than estimate without them silently.
#[must_use]
pub fn output_layer_requests(targets: &Targets) -> Vec<&str> {
    match targets {
        Targets::Names(names) => names
            .iter()
            .map(String::as_str)
            .filter(|n| is_output_layer(n))
            .collect(),
        _ => Vec::new(),
    }
}

/// Maps requested target names onto the model's Linear names. Names the model has are kept
/// as they are; role names (`query`, `mlp`, `output_proj`, ...) become the model's Linears of
/// that role; `head`/`lm_head` is dropped (adapters on lm_head are not modelled), and so is a
/// name that only a [`WeightLayout::Stacked`] weight answers to (PEFT matches modules; a
/// weight stacked from transformers 5 keeps its name, [`crate::job::Job::adapts`] decides);
/// unknown names are kept so that [`crate::job::Job::validate`] reports them.
#[must_use]
pub fn resolve(model: &ModelSpec, targets: &Targets) -> Targets {
    resolve_names(model, targets)
}

fn resolve_names(model: &ModelSpec, targets: &Targets) -> Targets {
    let Targets::Names(names) = targets else {
        return targets.clone();
    };
    let h = model.hidden_size;
    let mut out: Vec<String> = Vec::new();
    let mut push = |n: &str| {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_owned());
        }
    };
    for name in names {
        // "mlp(w1,w2,w3)": a role with the trainer's own member names in parentheses.
        if is_output_layer(name) {
            continue;
        }
        let name = &name.split('(').next().unwrap_or(name).trim().to_owned();
        let lower = name.to_ascii_lowercase();
        if model
            .linears()
            .any(|(_, l)| &l.name == name && l.layout != WeightLayout::Stacked)
        {
            push(name);
            continue;
        }
        let wanted = roles_of_request(&lower);
        let mut found = false;
        let mut fused_only = false;
        for (_, l) in model.linears() {
            let has = roles_of_linear(&l.name, l.role, l.out_features, h);
            let role_matches = has.iter().any(|r| wanted.contains(r)) || &l.name == name;
            if role_matches && l.layout != WeightLayout::Stacked {
                push(&l.name);
                found = true;
            } else if role_matches {
                fused_only = true;
            }
        }
        // A name whose only match is a fused weight (gpt-oss's experts) matches no module:
        // PEFT skips it as long as another entry matches, and so does this.
        if !found && !fused_only {
            push(name);
        }
    }
    Targets::Names(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: Targets) -> Vec<String> {
        match t {
            Targets::Names(v) => v,
            Targets::AllLinear => vec!["all-linear".into()],
        }
    }

    #[test]
    fn roles_map_onto_real_modules() {
        let llama =
            crate::catalog::load(crate::catalog::find("meta-llama/Llama-3.1-8B").unwrap()).unwrap();
        let t = Targets::Names(vec!["query".into(), "value".into(), "mlp(w1,w2,w3)".into()]);
        assert_eq!(
            names(resolve(&llama, &t)),
            ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
        );
        let neox =
            crate::catalog::load(crate::catalog::find("EleutherAI/pythia-160m").unwrap()).unwrap();
        let t = Targets::Names(vec!["q_proj".into(), "v_proj".into(), "o_proj".into()]);
        assert_eq!(names(resolve(&neox, &t)), ["query_key_value", "dense"]);
        // unknown names are kept for validation to report
        let t = Targets::Names(vec!["nonsense".into(), "lm_head".into()]);
        assert_eq!(names(resolve(&llama, &t)), ["nonsense"]);
    }
}
