//! Shapes a model cannot run.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Job, Targets};

/// GPT-2 learns 1,024 absolute positions (`n_positions`); position 1,024 does not exist.
#[test]
fn sequences_longer_than_learned_positions_are_rejected() {
    let m = catalog::load(catalog::find("openai-community/gpt2").expect("catalog")).unwrap();
    assert_eq!(m.position_embeddings, 1024);
    let mut ok = Job {
        seq_len: 1024,
        ..Job::default()
    };
    ok.adapter.targets = moro_core::targets::resolve(&m, &Targets::AllLinear);
    assert!(estimate(&m, &ok, &DeviceProfile::default()).is_ok());
    let long = Job {
        seq_len: 1025,
        ..ok.clone()
    };
    let e = estimate(&m, &long, &DeviceProfile::default()).unwrap_err();
    assert_eq!(e.field, "max_seq_length");
    assert!(e.message.contains("1024"), "{}", e.message);
}
