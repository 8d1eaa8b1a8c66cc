//! A moro.yaml read from a file: [`load`] and [`LoadedRecipe`].

use std::path::Path;

use anyhow::Result;
use moro_core::hardware::{Device, Hardware, HardwareSpec, parse_hardware_spec};
use moro_core::job::JobSettings;
use moro_recipe::Recipe;

use crate::error::{self, user};
use crate::hw::Target;

/// A recipe read from a file.
#[derive(Debug, Clone)]
pub(crate) struct LoadedRecipe {
    /// The path as given.
    pub(crate) path: String,
    /// The file's text.
    pub(crate) text: String,
    /// The parsed recipe.
    pub(crate) recipe: Recipe,
    /// What it says of the job (for flags to layer over, then [`crate::setup::resolve`]).
    pub(crate) settings: JobSettings,
}

/// Reads and validates a recipe file; errors carry the path, line and column (exit 2).
pub(crate) fn load(path: &Path) -> Result<LoadedRecipe> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| user(format!("cannot read `{shown}`: {e}")))?;
    LoadedRecipe::from_bytes(shown, &bytes)
}

impl LoadedRecipe {
    /// Parses and validates the bytes of the recipe shown as `shown` in errors.
    pub(crate) fn from_bytes(shown: String, bytes: &[u8]) -> Result<Self> {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let recipe = moro_recipe::parse_bytes(bytes).map_err(|e| error::recipe(e, &shown))?;
        let settings = recipe.settings().map_err(|e| error::recipe(e, &shown))?;
        let loaded = Self {
            path: shown,
            text,
            recipe,
            settings,
        };
        loaded
            .settings
            .check_adapters_used()
            .map_err(|e| loaded.job_error(&e))?;
        Ok(loaded)
    }

    /// A job error of this recipe at its line and column.
    pub(crate) fn job_error(&self, e: &moro_core::job::JobError) -> anyhow::Error {
        crate::error::job_at(
            e,
            moro_recipe::job_error(e, Some(&self.text))
                .with_source(&self.path)
                .to_string(),
        )
    }

    /// The hardware the recipe was made for, from its `hardware:` section: the preset (with
    /// the GPU count), else a GPU of `memory_bytes` (an Apple one with `device: mps`). `None`
    /// without either.
    pub(crate) fn target(&self) -> Option<Target> {
        let h = self.recipe.hardware.as_ref()?;
        let count = h.count.max(1);
        if let Some(p) = h.preset.as_deref() {
            let spec = if count > 1 {
                format!("{count}x{p}")
            } else {
                p.to_owned()
            };
            if let Ok(HardwareSpec::Given(hardware)) = parse_hardware_spec(&spec) {
                return Some(Target {
                    hardware,
                    detected: false,
                    spec,
                });
            }
        }
        let bytes = h.memory_bytes?;
        let mut d = if h.device == Some(moro_recipe::choices::Backend::Mps) {
            Device::generic_apple(bytes)
        } else {
            Device::generic(bytes)
        };
        if let Some(n) = &h.name {
            d.name.clone_from(n);
        }
        let devices = vec![d; usize::try_from(count).unwrap_or(1)];
        Some(Target {
            hardware: Hardware { devices },
            detected: false,
            spec: format!("{bytes}B"),
        })
    }

    /// Usable memory per GPU the recipe was generated against (`prediction.memory_bytes`).
    pub(crate) fn usable_bytes(&self) -> Option<u64> {
        self.recipe.prediction.as_ref().and_then(|p| p.memory_bytes)
    }
}
